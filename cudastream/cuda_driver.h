// cuda_driver.h: the few CUDA driver types kvtier needs, declared here so that
// no CUDA header is needed at build time, and the per-device dispatch table.
//
// Layouts follow cuda.h (x86-64 and aarch64 Linux, LP64). Every entry point is
// resolved through cuGetProcAddress at the CUDA version its declaration below
// was written against, so a newer driver keeps this ABI.

#ifndef KVTIER_CUDA_DRIVER_H
#define KVTIER_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

typedef int drvResult; // CUresult
typedef int drvCUdevice;
typedef void *drvCUcontext;
typedef void *drvCUstream;
typedef void *drvCUevent;
typedef unsigned long long drvCUdeviceptr;
typedef unsigned long long drvCUhandle; // CUmemGenericAllocationHandle
typedef void *drvCUmodule;
typedef void *drvCUfunction;

// Results of our own, outside CUresult's range.
#define DRV_MISSING (-1)          // the entry point is not in this driver
#define DRV_NOMEM (-2)            // malloc failed on our side
#define DRV_OUT_OF_RANGE (-3)     // a copy runs past the end of its device allocation
#define DRV_CTX_FAILED 0x40000000 // or'ed into cuCtxSetCurrent's result
#define DRV_NOT_DEVICE 0x20000000 // or'ed into cuMemGetAddressRange's result
#define DRV_NOT_HOST 0x10000000   // or'ed into cuPointerGetAttribute's result (kernel copies)
#define DRV_NO_MODULE (-4)        // the copy kernel's module is not loaded
#define DRV_HOST_UNMAPPED (-5)    // host memory the GPU cannot reach at the host's address

// CUmemLocationType
enum { drvLocInvalid = 0, drvLocDevice = 1, drvLocHost = 2, drvLocHostNUMA = 3 };

typedef struct {
	int type; // CUmemLocationType
	int id;
} drvMemLocation;

typedef struct {
	int type;                 // CUmemAllocationType: PINNED = 1
	int requestedHandleTypes; // CUmemAllocationHandleType: NONE = 0
	drvMemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} drvMemAllocationProp;

typedef struct {
	drvMemLocation location;
	int flags; // CUmemAccess_flags: PROT_READWRITE = 3
} drvMemAccessDesc;

typedef struct {
	int srcAccessOrder; // CUmemcpySrcAccessOrder: STREAM = 1
	drvMemLocation srcLocHint;
	drvMemLocation dstLocHint;
	unsigned int flags;
} drvMemcpyAttributes;

// drvMemcpy2D has the layout of CUDA_MEMCPY2D.
typedef struct {
	size_t srcXInBytes, srcY;
	int srcMemoryType; // CUmemorytype: HOST = 1, DEVICE = 2
	const void *srcHost;
	drvCUdeviceptr srcDevice;
	void *srcArray;
	size_t srcPitch;
	size_t dstXInBytes, dstY;
	int dstMemoryType;
	void *dstHost;
	drvCUdeviceptr dstDevice;
	void *dstArray;
	size_t dstPitch;
	size_t widthInBytes, height;
} drvMemcpy2D;

// drvCopy2D has the layout of the Go type Copy2D.
typedef struct {
	uint64_t dst, src;
	int64_t dstPitch, srcPitch, width, height;
} drvCopy2D;

// drvCopy has the layout of the Go type Copy.
typedef struct {
	uint64_t dst, src;
	int64_t bytes;
} drvCopy;

typedef struct drvTable {
	void *lib;
	int driverVersion;
	int batchABI; // 0: none, 12080: with failIdx, 13000: without
	unsigned long long freeGen; // bumped by every device free: range caches expire
	unsigned long long hostGen; // bumped by every host unregister or free: host range caches expire

	// Batched-copy attributes (cuMemcpyBatchAsync). Zero means the default:
	// srcAccessOrder STREAM, location hints set, no flags, every descriptor
	// checked. Set only by tests and benchmarks that measure the variants.
	int batchOrder;       // CUmemcpySrcAccessOrder; 0: STREAM (1)
	unsigned batchFlags;  // CUmemcpyFlags
	int batchNoHints;     // 1: no location hints
	int batchNoCheck;     // 1: skip the per-descriptor device range check
	unsigned batchChunk;  // descriptors per cuMemcpyBatchAsync call; 0: DRV_BATCH_CHUNK

	// The copy kernel's module (kvtier_copy, kvtier_fma), loaded once.
	drvCUmodule copyModule;
	drvCUfunction copyFn, fmaFn;
	// The word-sum kernel's module (kvtier_wordsum), loaded once.
	drvCUmodule sumModule;
	drvCUfunction sumFn;
	drvCUdevice dev;
	drvCUcontext ctx;

	drvResult (*getProcAddress)(const char *, void **, int, unsigned long long, int *);
	drvResult (*getErrorName)(drvResult, const char **);
	drvResult (*getErrorString)(drvResult, const char **);

	drvResult (*init)(unsigned int);
	drvResult (*driverGetVersion)(int *);
	drvResult (*deviceGetCount)(int *);
	drvResult (*deviceGet)(drvCUdevice *, int);
	drvResult (*deviceGetName)(char *, int, drvCUdevice);
	drvResult (*deviceGetAttribute)(int *, int, drvCUdevice);
	drvResult (*deviceTotalMem)(size_t *, drvCUdevice);
	drvResult (*deviceGetPCIBusId)(char *, int, drvCUdevice);
	drvResult (*primaryCtxRetain)(drvCUcontext *, drvCUdevice);
	drvResult (*primaryCtxRelease)(drvCUdevice);
	drvResult (*ctxSetCurrent)(drvCUcontext);
	drvResult (*ctxGetStreamPriorityRange)(int *, int *);

	drvResult (*memGetInfo)(size_t *, size_t *);
	drvResult (*memAlloc)(drvCUdeviceptr *, size_t);
	drvResult (*memFree)(drvCUdeviceptr);
	drvResult (*memGetAddressRange)(drvCUdeviceptr *, size_t *, drvCUdeviceptr);
	drvResult (*memHostRegister)(void *, size_t, unsigned int);
	drvResult (*memHostUnregister)(void *);
	drvResult (*memHostAlloc)(void **, size_t, unsigned int);
	drvResult (*memFreeHost)(void *);

	drvResult (*memGetAllocationGranularity)(size_t *, const drvMemAllocationProp *, int);
	drvResult (*memCreate)(drvCUhandle *, size_t, const drvMemAllocationProp *, unsigned long long);
	drvResult (*memRelease)(drvCUhandle);
	drvResult (*memAddressReserve)(drvCUdeviceptr *, size_t, size_t, drvCUdeviceptr, unsigned long long);
	drvResult (*memAddressFree)(drvCUdeviceptr, size_t);
	drvResult (*memMap)(drvCUdeviceptr, size_t, size_t, drvCUhandle, unsigned long long);
	drvResult (*memUnmap)(drvCUdeviceptr, size_t);
	drvResult (*memSetAccess)(drvCUdeviceptr, size_t, const drvMemAccessDesc *, size_t);

	drvResult (*streamCreateWithPriority)(drvCUstream *, unsigned int, int);
	drvResult (*streamDestroy)(drvCUstream);
	drvResult (*streamQuery)(drvCUstream);
	drvResult (*streamSynchronize)(drvCUstream);
	drvResult (*streamWaitEvent)(drvCUstream, drvCUevent, unsigned int);

	drvResult (*eventCreate)(drvCUevent *, unsigned int);
	drvResult (*eventRecord)(drvCUevent, drvCUstream);
	drvResult (*eventQuery)(drvCUevent);
	drvResult (*eventSynchronize)(drvCUevent);
	drvResult (*eventDestroy)(drvCUevent);
	drvResult (*eventElapsedTime)(float *, drvCUevent, drvCUevent);

	drvResult (*pointerGetAttribute)(void *, int, drvCUdeviceptr);
	drvResult (*moduleLoadData)(drvCUmodule *, const void *);
	drvResult (*moduleUnload)(drvCUmodule);
	drvResult (*moduleGetFunction)(drvCUfunction *, drvCUmodule, const char *);
	drvResult (*launchKernel)(drvCUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
	                          drvCUstream, void **, void **);

	drvResult (*memcpyHtoDAsync)(drvCUdeviceptr, const void *, size_t, drvCUstream);
	drvResult (*memcpyDtoHAsync)(void *, drvCUdeviceptr, size_t, drvCUstream);
	drvResult (*memcpyDtoDAsync)(drvCUdeviceptr, drvCUdeviceptr, size_t, drvCUstream);
	drvResult (*memcpy2DAsync)(const void *, drvCUstream); // const CUDA_MEMCPY2D *
	// CUDA 13.0: cuMemcpyBatchAsync_v2, no failIdx.
	drvResult (*memcpyBatchAsync13)(drvCUdeviceptr *, drvCUdeviceptr *, size_t *, size_t,
	                                drvMemcpyAttributes *, size_t *, size_t, drvCUstream);
	// CUDA 12.8: cuMemcpyBatchAsync, with failIdx.
	drvResult (*memcpyBatchAsync128)(drvCUdeviceptr *, drvCUdeviceptr *, size_t *, size_t,
	                                 drvMemcpyAttributes *, size_t *, size_t, size_t *, drvCUstream);
} drvTable;

typedef struct {
	drvCUdeviceptr base;
	size_t size;
} drvRange;

#define DRV_RANGE_CACHE 8
#define DRV_KRING_MAX 1024 // most slots of a stream's kernel-copy descriptor ring

// drvStreamState is one stream's C-side state, serialised by the Go side:
// the descriptor arrays for cuMemcpyBatchAsync (grown on demand, reused) and
// a small cache of device allocations its copies were checked against.
typedef struct {
	drvCUdeviceptr *dsts, *srcs;
	size_t *sizes, *index;
	size_t cap;
	drvRange ranges[DRV_RANGE_CACHE];
	unsigned nranges, next;
	unsigned long long gen; // freeGen the cache was filled under

	// Host ranges the kernel copy checked (cuPointerGetAttribute).
	drvRange hranges[DRV_RANGE_CACHE];
	unsigned nhranges, hnext;
	unsigned long long hgen; // hostGen the cache was filled under

	// The kernel copy's descriptor ring, allocated at first use: kslots
	// slots of kcap pieces, in pinned host memory (khost) and device memory
	// (kdev). Slot i is filled on the host, copied to the device in stream
	// order, read by the launch after it, and refilled only once kev[i]
	// (recorded after that launch) has completed: a copy finding every slot
	// still pending waits on the host.
	drvCopy *khost;
	drvCUdeviceptr kdev;
	drvCUdeviceptr kmapped; // khost as the device reaches it (0: not mapped)
	drvCUevent kev[DRV_KRING_MAX];
	unsigned char kused[DRV_KRING_MAX];
	unsigned knext, kslots;
	size_t kcap;
} drvStreamState;

// drvKernelOpts tunes one kernel copy.
typedef struct {
	unsigned ctas;       // CTAs per launch (at most; fewer when there are fewer pieces)
	unsigned threads;    // threads per CTA
	size_t pieceBytes;   // copies longer than this are cut into pieces of this size
	unsigned launches;   // slots of the descriptor ring (at its first use)
	unsigned pieces;     // pieces per slot (at its first use)
	int mapped;          // the launch reads its descriptors from the pinned slot, not a device copy
} drvKernelOpts;

// Loading. drvLoad returns NULL and fills errbuf on failure.
drvTable *drvLoad(char *errbuf, size_t errlen);
void drvUnload(drvTable *t);
const char *drvErrorName(drvTable *t, drvResult r);
const char *drvErrorString(drvTable *t, drvResult r);

// Wrappers. Each one that needs the context makes it current first.
drvResult drvInit(drvTable *t);
drvResult drvDeviceGetCount(drvTable *t, int *n);
drvResult drvDeviceGet(drvTable *t, int ordinal); // sets t->dev
drvResult drvDeviceName(drvTable *t, char *buf, int len);
drvResult drvTotalMem(drvTable *t, size_t *n);
drvResult drvPCIBusID(drvTable *t, char *buf, int len);
drvResult drvAttr(drvTable *t, int attr, int *v);
drvResult drvRetainPrimary(drvTable *t);
drvResult drvReleasePrimary(drvTable *t);
drvResult drvPriorityRange(drvTable *t, int *least, int *greatest);
drvResult drvMemGetInfo(drvTable *t, size_t *freeb, size_t *total);
drvResult drvMemAlloc(drvTable *t, drvCUdeviceptr *p, size_t n);
drvResult drvMemFree(drvTable *t, drvCUdeviceptr p);
drvResult drvHostRegister(drvTable *t, uint64_t addr, size_t n, unsigned int flags);
drvResult drvHostUnregister(drvTable *t, uint64_t addr);
drvResult drvHostAlloc(drvTable *t, void **p, size_t n, unsigned int flags);
drvResult drvHostFree(drvTable *t, void *p);
drvResult drvProbeHostNUMA(drvTable *t, int node, int *step);
drvResult drvHostAllocVMM(drvTable *t, size_t n, int node, drvCUdeviceptr *ptr, drvCUhandle *h,
                          size_t *mapped, void **addr, int *step);
drvResult drvHostFreeVMM(drvTable *t, drvCUdeviceptr ptr, size_t mapped, drvCUhandle h, int *step);
drvResult drvStreamCreate(drvTable *t, drvCUstream *s, unsigned int flags, int prio);
drvResult drvStreamDestroy(drvTable *t, drvCUstream s);
drvResult drvStreamQuery(drvTable *t, drvCUstream s);
drvResult drvStreamSynchronize(drvTable *t, drvCUstream s);
drvResult drvStreamWaitEvent(drvTable *t, drvCUstream s, drvCUevent e);
drvResult drvEventCreate(drvTable *t, drvCUevent *e, unsigned int flags);
drvResult drvEventRecord(drvTable *t, drvCUevent e, drvCUstream s);
drvResult drvEventQuery(drvTable *t, drvCUevent e);
drvResult drvEventSynchronize(drvTable *t, drvCUevent e);
drvResult drvEventDestroy(drvTable *t, drvCUevent e);
drvResult drvEventElapsed(drvTable *t, float *ms, drvCUevent start, drvCUevent end);
drvResult drvCopyHtoD(drvTable *t, drvStreamState *st, drvCUdeviceptr dst, uint64_t src, size_t n, drvCUstream s);
drvResult drvCopyDtoH(drvTable *t, drvStreamState *st, uint64_t dst, drvCUdeviceptr src, size_t n, drvCUstream s);
drvResult drvCopy2DAsync(drvTable *t, drvStreamState *st, int kind, const drvCopy2D *c, drvCUstream s);
drvResult drvCopyDtoD(drvTable *t, drvStreamState *st, drvCUdeviceptr dst, drvCUdeviceptr src, size_t n,
                      drvCUstream s);
// Every copy first checks that its device side lies inside one device
// allocation (cuMemGetAddressRange, cached per stream): the driver infers a
// copy's direction from the addresses, and would take an address that is not
// device memory for host memory and read or write it from the CPU.
//
// drvCopyBatch enqueues n copies of one kind (0 HtoD, 1 DtoH, 2 DtoD). On
// failure *failIdx is the index into ops of the failed copy, or SIZE_MAX when
// the driver does not say. Without cuMemcpyBatchAsync it loops single copies.
drvResult drvCopyBatch(drvTable *t, drvStreamState *st, drvCUstream s, int kind, const drvCopy *ops, size_t n,
                       size_t *failIdx);
void drvStreamStateFree(drvTable *t, drvStreamState *st);

// drvLoadCopyModule loads the PTX image once (cuModuleLoadData) and finds the
// kernels; drvUnloadCopyModule undoes it. hostPtr reports
// CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM.
drvResult drvLoadCopyModule(drvTable *t, const char *ptx, int *hostPtr, int *step);
drvResult drvUnloadCopyModule(drvTable *t);
// drvCopyKernel checks every descriptor (device side: inside one device
// allocation; host side: pinned and mapped at its own address), then
// enqueues the copies as launches of kvtier_copy on s, in chunks of the
// stream's ring. On a failed check *failIdx is the descriptor's index and
// nothing was enqueued.
drvResult drvCopyKernel(drvTable *t, drvStreamState *st, drvCUstream s, int kind, const drvCopy *ops, size_t n,
                        const drvKernelOpts *o, size_t *failIdx, int *step);
// drvLoadSumModule loads the word-sum PTX image once and finds
// kvtier_wordsum; drvUnloadSumModule undoes it. *step is 2 (load) or 3
// (get function) on failure.
drvResult drvLoadSumModule(drvTable *t, const char *ptx, int *step);
drvResult drvUnloadSumModule(drvTable *t);
// drvLaunchWordSum enqueues one launch of kvtier_wordsum on s: grid
// (chunks, pieces, n) of threads threads over the n <= 256 blocks ids.
drvResult drvLaunchWordSum(drvTable *t, drvCUstream s, drvCUdeviceptr bases, unsigned pieces,
                           unsigned long long pieceWords, unsigned long long blockStride, const int *ids, unsigned n,
                           unsigned long long chunkWords, unsigned chunks, unsigned threads, drvCUdeviceptr partials);
// drvLaunchFMA enqueues kvtier_fma over grid x threads threads.
drvResult drvLaunchFMA(drvTable *t, drvCUstream s, drvCUdeviceptr out, unsigned grid, unsigned threads,
                       unsigned iters);

// Modules of packages above cudastream (cuda_module.c). drvLaunch passes
// args[i] as the kernel's parameter i: every parameter is 8 bytes.
#define DRV_MAX_LAUNCH_ARGS 16
drvResult drvModuleLoad(drvTable *t, const char *ptx, drvCUmodule *m);
drvResult drvModuleFunction(drvTable *t, drvCUmodule m, const char *name, drvCUfunction *f);
drvResult drvModuleUnload(drvTable *t, drvCUmodule m);
drvResult drvLaunch(drvTable *t, drvCUstream s, drvCUfunction f, const unsigned *grid, const unsigned *block,
                    unsigned sharedBytes, const unsigned long long *args, unsigned nargs);

#endif
