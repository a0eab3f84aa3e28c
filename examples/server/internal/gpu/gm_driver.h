// gm_driver.h: the CUDA driver and cuBLAS entry points the model's GPU
// backend needs, declared here so that no CUDA header or toolkit is needed
// at build time. Both libraries are opened at run time (libcuda.so.1;
// libcublas.so.13, else libcublas.so.12). Layouts and enum values follow
// cuda.h and cublas_api.h on LP64 Linux.

#ifndef KVTIER_GM_DRIVER_H
#define KVTIER_GM_DRIVER_H

#include <stddef.h>
#include <stdint.h>

typedef int gmResult;
typedef unsigned long long gmPtr; // CUdeviceptr
typedef void *gmFunc;             // CUfunction

// Steps that gmOpen reports on failure (which call failed).
enum {
	gmStepDlopenCuda = 1,
	gmStepSymbols,
	gmStepInit,
	gmStepDevice,
	gmStepContext,
	gmStepDlopenCublas,
	gmStepCublasSymbols,
	gmStepCublasCreate,
	gmStepModule,
};

// GM_MAX_EVENTS bounds the marks of one profiled pass (gmMark).
#define GM_MAX_EVENTS 1024

typedef struct gmLib {
	void *cuda, *cublas;
	int dev;
	void *ctx;
	void *handle; // cublasHandle_t
	void *module;
	void *hopper; // kernels/hopper.ptx's module, loaded by gmLoadHopper
	void *events[GM_MAX_EVENTS]; // gmMark's, created on first use

	gmResult (*getErrorName)(gmResult, const char **);
	gmResult (*init)(unsigned);
	gmResult (*deviceGet)(int *, int);
	gmResult (*primaryCtxRetain)(void **, int);
	gmResult (*primaryCtxRelease)(int);
	gmResult (*ctxSetCurrent)(void *);
	gmResult (*ctxSynchronize)(void);
	gmResult (*memAlloc)(gmPtr *, size_t);
	gmResult (*memFree)(gmPtr);
	gmResult (*memcpyHtoD)(gmPtr, const void *, size_t);
	gmResult (*memcpyDtoH)(void *, gmPtr, size_t);
	gmResult (*memsetD8)(gmPtr, unsigned char, size_t);
	gmResult (*moduleLoadData)(void **, const void *);
	gmResult (*moduleUnload)(void *);
	gmResult (*moduleGetFunction)(gmFunc *, void *, const char *);
	gmResult (*funcSetAttribute)(gmFunc, int, int);
	gmResult (*launchKernel)(gmFunc, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
	                         void **, void **);
	gmResult (*streamWaitEvent)(void *, void *, unsigned);
	gmResult (*deviceGetAttribute)(int *, int, int);
	gmResult (*eventCreate)(void **, unsigned);
	gmResult (*eventDestroy)(void *);
	gmResult (*eventRecord)(void *, void *);
	gmResult (*eventSynchronize)(void *);
	gmResult (*eventElapsedTime)(float *, void *, void *);

	int (*cublasCreate)(void **);
	int (*cublasDestroy)(void *);
	int (*cublasGemmEx)(void *, int, int, int, int, int, const void *, const void *, int, int, const void *, int,
	                    int, const void *, void *, int, int, int, int);
	int (*cublasGemmStridedBatchedEx)(void *, int, int, int, int, int, const void *, const void *, int, int,
	                                  long long, const void *, int, int, long long, const void *, void *, int, int,
	                                  long long, int, int, int);
	char cublasName[64];
} gmLib;

// gmGemm is one (strided batched) product, column-major as cuBLAS sees it:
// C = alpha op(A) op(B) + beta C. Types are cudaDataType values.
typedef struct {
	int transa, transb, m, n, k;
	float alpha, beta;
	gmPtr a, b, c;
	int atype, btype, ctype;
	int lda, ldb, ldc;
	long long strideA, strideB, strideC;
	int batch;
} gmGemm;

gmLib *gmOpen(const char *ptx, int *step, gmResult *rc, char *errbuf, size_t errlen);
void gmClose(gmLib *l);
const char *gmErrorName(gmLib *l, gmResult r);
gmResult gmSetCurrent(gmLib *l);
gmResult gmFunction(gmLib *l, const char *name, gmFunc *f);
gmResult gmAlloc(gmLib *l, gmPtr *p, size_t n);
gmResult gmFree(gmLib *l, gmPtr p);
gmResult gmHtoD(gmLib *l, gmPtr dst, const void *src, size_t n);
gmResult gmDtoH(gmLib *l, void *dst, gmPtr src, size_t n);
gmResult gmMemset(gmLib *l, gmPtr dst, size_t n);
gmResult gmSync(gmLib *l);
// gmSharedBytes lets f use up to bytes of dynamic shared memory
// (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).
gmResult gmSharedBytes(gmLib *l, gmFunc f, int bytes);
// gmLaunch launches f with nargs arguments, each in an 8-byte slot of args
// (4-byte arguments in the slot's low half), on the legacy default stream.
gmResult gmLaunch(gmLib *l, gmFunc f, unsigned gx, unsigned gy, unsigned bx, unsigned shared, const uint64_t *args,
                  int nargs);
// gmWaitEvent makes later work on the legacy default stream (the model's)
// wait until the work captured by ev (a CUevent, possibly recorded on a
// stream of another component of the process) completes, without blocking
// the host.
gmResult gmWaitEvent(gmLib *l, uintptr_t ev);
// gmComputeCapability reads the device's compute capability.
gmResult gmComputeCapability(gmLib *l, int *major, int *minor);
// gmLoadHopper loads the Hopper kernels' PTX (sm_90a) as a second module;
// gmHopperFunction finds a kernel in it.
gmResult gmLoadHopper(gmLib *l, const char *ptx);
gmResult gmHopperFunction(gmLib *l, const char *name, gmFunc *f);
// gmMark records event i (below GM_MAX_EVENTS, created on first use) on the
// legacy default stream; gmElapsed waits for event j and returns the
// milliseconds from event i to event j.
gmResult gmMark(gmLib *l, int i);
gmResult gmElapsed(gmLib *l, int i, int j, float *ms);
// gmGemmRun returns a cublasStatus_t.
int gmGemmRun(gmLib *l, const gmGemm *g);

#endif
