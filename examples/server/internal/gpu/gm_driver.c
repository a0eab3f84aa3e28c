//go:build cgo

// gm_driver.c: the thin C layer under gpu_cgo.go. Every call that needs the
// device's primary context is made while the Go side holds the OS thread
// and has made the context current (gmSetCurrent).

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gm_driver.h"

#define GM_MAX_ARGS 16

static void *gmProc(void *gpa, const char *sym) {
	void *p = NULL;
	int status = -1;
	gmResult (*get)(const char *, void **, int, unsigned long long, int *) =
	    (gmResult(*)(const char *, void **, int, unsigned long long, int *))gpa;
	if (get(sym, &p, 12000, 0, &status) != 0 || status != 0)
		return NULL;
	return p;
}

gmLib *gmOpen(const char *ptx, int *step, gmResult *rc, char *errbuf, size_t errlen) {
	*rc = 0;
	*step = gmStepDlopenCuda;
	dlerror();
	void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (cuda == NULL) {
		const char *e = dlerror();
		snprintf(errbuf, errlen, "dlopen: %s", e ? e : "libcuda.so.1");
		return NULL;
	}
	gmLib *l = calloc(1, sizeof(gmLib));
	if (l == NULL) {
		snprintf(errbuf, errlen, "calloc failed");
		dlclose(cuda);
		return NULL;
	}
	l->cuda = cuda;
	*step = gmStepSymbols;
	dlerror();
	void *gpa = dlsym(cuda, "cuGetProcAddress_v2");
	if (gpa == NULL) {
		snprintf(errbuf, errlen, "dlsym cuGetProcAddress_v2 (driver older than CUDA 12.0?)");
		gmClose(l);
		return NULL;
	}
	l->getErrorName = (gmResult(*)(gmResult, const char **))dlsym(cuda, "cuGetErrorName");
#define P(field, sym)                                                                                                \
	do {                                                                                                         \
		*(void **)&l->field = gmProc(gpa, sym);                                                              \
		if (l->field == NULL) {                                                                              \
			snprintf(errbuf, errlen, "the driver lacks %s", sym);                                        \
			gmClose(l);                                                                                  \
			return NULL;                                                                                 \
		}                                                                                                    \
	} while (0)
	P(init, "cuInit");
	P(deviceGet, "cuDeviceGet");
	P(primaryCtxRetain, "cuDevicePrimaryCtxRetain");
	P(primaryCtxRelease, "cuDevicePrimaryCtxRelease");
	P(ctxSetCurrent, "cuCtxSetCurrent");
	P(ctxSynchronize, "cuCtxSynchronize");
	P(memAlloc, "cuMemAlloc");
	P(memFree, "cuMemFree");
	P(memcpyHtoD, "cuMemcpyHtoD");
	P(memcpyDtoH, "cuMemcpyDtoH");
	P(memsetD8, "cuMemsetD8");
	P(moduleLoadData, "cuModuleLoadData");
	P(moduleUnload, "cuModuleUnload");
	P(moduleGetFunction, "cuModuleGetFunction");
	P(funcSetAttribute, "cuFuncSetAttribute");
	P(launchKernel, "cuLaunchKernel");
	P(streamWaitEvent, "cuStreamWaitEvent");
	P(deviceGetAttribute, "cuDeviceGetAttribute");
	P(eventCreate, "cuEventCreate");
	P(eventDestroy, "cuEventDestroy");
	P(eventRecord, "cuEventRecord");
	P(eventSynchronize, "cuEventSynchronize");
	P(eventElapsedTime, "cuEventElapsedTime");
#undef P
// FAIL names the failed driver call and its error, then undoes the open.
#define FAIL(call)                                                                                                   \
	do {                                                                                                         \
		snprintf(errbuf, errlen, "%s: %s (%d)", call, gmErrorName(l, *rc), *rc);                             \
		gmClose(l);                                                                                          \
		return NULL;                                                                                         \
	} while (0)
	*step = gmStepInit;
	if ((*rc = l->init(0)) != 0)
		FAIL("cuInit");
	*step = gmStepDevice;
	if ((*rc = l->deviceGet(&l->dev, 0)) != 0)
		FAIL("cuDeviceGet");
	*step = gmStepContext;
	if ((*rc = l->primaryCtxRetain(&l->ctx, l->dev)) != 0) {
		l->ctx = NULL;
		FAIL("cuDevicePrimaryCtxRetain");
	}
	if ((*rc = l->ctxSetCurrent(l->ctx)) != 0)
		FAIL("cuCtxSetCurrent");

	*step = gmStepDlopenCublas;
	static const char *names[] = {"libcublas.so.13", "libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so.13",
	                              "/usr/local/cuda/lib64/libcublas.so.12"};
	char tried[512] = "";
	for (size_t i = 0; i < sizeof names / sizeof names[0] && l->cublas == NULL; i++) {
		dlerror();
		l->cublas = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (l->cublas != NULL) {
			snprintf(l->cublasName, sizeof l->cublasName, "%s", names[i]);
		} else {
			const char *e = dlerror();
			size_t used = strlen(tried);
			snprintf(tried + used, sizeof tried - used, "%s%s", used ? "; " : "", e ? e : names[i]);
		}
	}
	if (l->cublas == NULL) {
		snprintf(errbuf, errlen, "dlopen: %s", tried);
		gmClose(l);
		return NULL;
	}
	*step = gmStepCublasSymbols;
#define B(field, sym)                                                                                                \
	do {                                                                                                         \
		dlerror();                                                                                           \
		*(void **)&l->field = dlsym(l->cublas, sym);                                                         \
		if (l->field == NULL) {                                                                              \
			snprintf(errbuf, errlen, "%s lacks %s", l->cublasName, sym);                                 \
			gmClose(l);                                                                                  \
			return NULL;                                                                                 \
		}                                                                                                    \
	} while (0)
	B(cublasCreate, "cublasCreate_v2");
	B(cublasDestroy, "cublasDestroy_v2");
	B(cublasGemmEx, "cublasGemmEx");
	B(cublasGemmStridedBatchedEx, "cublasGemmStridedBatchedEx");
#undef B
	*step = gmStepCublasCreate;
	if ((*rc = l->cublasCreate(&l->handle)) != 0) {
		snprintf(errbuf, errlen, "cublasCreate_v2: status %d", *rc);
		l->handle = NULL;
		gmClose(l);
		return NULL;
	}
	*step = gmStepModule;
	if ((*rc = l->moduleLoadData(&l->module, ptx)) != 0) {
		l->module = NULL;
		FAIL("cuModuleLoadData (kernels/model.ptx)");
	}
#undef FAIL
	*step = 0;
	return l;
}

void gmClose(gmLib *l) {
	if (l == NULL)
		return;
	if (l->ctx != NULL)
		l->ctxSetCurrent(l->ctx);
	if (l->module != NULL)
		l->moduleUnload(l->module);
	if (l->hopper != NULL)
		l->moduleUnload(l->hopper);
	for (int i = 0; i < GM_MAX_EVENTS; i++)
		if (l->events[i] != NULL)
			l->eventDestroy(l->events[i]);
	if (l->handle != NULL)
		l->cublasDestroy(l->handle);
	if (l->cublas != NULL)
		dlclose(l->cublas);
	if (l->ctx != NULL)
		l->primaryCtxRelease(l->dev);
	// libcuda stays loaded: the driver does not support being unloaded
	// while other users (cudastream, cuBLAS's runtime) hold it.
	free(l);
}

const char *gmErrorName(gmLib *l, gmResult r) {
	const char *s = NULL;
	if (l != NULL && l->getErrorName != NULL && l->getErrorName(r, &s) == 0 && s != NULL)
		return s;
	return "CUDA_ERROR_UNKNOWN";
}

gmResult gmSetCurrent(gmLib *l) { return l->ctxSetCurrent(l->ctx); }
gmResult gmFunction(gmLib *l, const char *name, gmFunc *f) { return l->moduleGetFunction(f, l->module, name); }
gmResult gmAlloc(gmLib *l, gmPtr *p, size_t n) { return l->memAlloc(p, n); }
gmResult gmFree(gmLib *l, gmPtr p) { return l->memFree(p); }
gmResult gmHtoD(gmLib *l, gmPtr dst, const void *src, size_t n) { return l->memcpyHtoD(dst, src, n); }
gmResult gmDtoH(gmLib *l, void *dst, gmPtr src, size_t n) { return l->memcpyDtoH(dst, src, n); }
gmResult gmMemset(gmLib *l, gmPtr dst, size_t n) { return l->memsetD8(dst, 0, n); }
gmResult gmSync(gmLib *l) { return l->ctxSynchronize(); }

gmResult gmSharedBytes(gmLib *l, gmFunc f, int bytes) {
	const int maxDynamicShared = 8; // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
	return l->funcSetAttribute(f, maxDynamicShared, bytes);
}

gmResult gmLaunch(gmLib *l, gmFunc f, unsigned gx, unsigned gy, unsigned bx, unsigned shared, const uint64_t *args,
                  int nargs) {
	void *params[GM_MAX_ARGS];
	uint64_t slots[GM_MAX_ARGS];
	if (nargs > GM_MAX_ARGS)
		return 1; // CUDA_ERROR_INVALID_VALUE
	for (int i = 0; i < nargs; i++) {
		slots[i] = args[i];
		params[i] = &slots[i];
	}
	return l->launchKernel(f, gx, gy, 1, bx, 1, 1, shared, NULL, params, NULL);
}

gmResult gmWaitEvent(gmLib *l, uintptr_t ev) { return l->streamWaitEvent(NULL, (void *)ev, 0); }

int gmGemmRun(gmLib *l, const gmGemm *g) {
	const int compute32F = 68, algoDefault = -1;
	if (g->batch <= 1)
		return l->cublasGemmEx(l->handle, g->transa, g->transb, g->m, g->n, g->k, &g->alpha, (const void *)g->a,
		                       g->atype, g->lda, (const void *)g->b, g->btype, g->ldb, &g->beta, (void *)g->c,
		                       g->ctype, g->ldc, compute32F, algoDefault);
	return l->cublasGemmStridedBatchedEx(l->handle, g->transa, g->transb, g->m, g->n, g->k, &g->alpha,
	                                     (const void *)g->a, g->atype, g->lda, g->strideA, (const void *)g->b,
	                                     g->btype, g->ldb, g->strideB, &g->beta, (void *)g->c, g->ctype, g->ldc,
	                                     g->strideC, g->batch, compute32F, algoDefault);
}

gmResult gmComputeCapability(gmLib *l, int *major, int *minor) {
	const int attrMajor = 75, attrMinor = 76; // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}
	gmResult rc = l->deviceGetAttribute(major, attrMajor, l->dev);
	if (rc != 0)
		return rc;
	return l->deviceGetAttribute(minor, attrMinor, l->dev);
}

gmResult gmLoadHopper(gmLib *l, const char *ptx) {
	if (l->hopper != NULL)
		return 0;
	gmResult rc = l->moduleLoadData(&l->hopper, ptx);
	if (rc != 0)
		l->hopper = NULL;
	return rc;
}

gmResult gmHopperFunction(gmLib *l, const char *name, gmFunc *f) {
	if (l->hopper == NULL)
		return 200; // CUDA_ERROR_INVALID_IMAGE: no module loaded
	return l->moduleGetFunction(f, l->hopper, name);
}

gmResult gmMark(gmLib *l, int i) {
	if (i < 0 || i >= GM_MAX_EVENTS)
		return 1; // CUDA_ERROR_INVALID_VALUE
	if (l->events[i] == NULL) {
		gmResult rc = l->eventCreate(&l->events[i], 0);
		if (rc != 0) {
			l->events[i] = NULL;
			return rc;
		}
	}
	return l->eventRecord(l->events[i], NULL);
}

gmResult gmElapsed(gmLib *l, int i, int j, float *ms) {
	if (i < 0 || j < 0 || i >= GM_MAX_EVENTS || j >= GM_MAX_EVENTS || l->events[i] == NULL || l->events[j] == NULL)
		return 1; // CUDA_ERROR_INVALID_VALUE
	gmResult rc = l->eventSynchronize(l->events[j]);
	if (rc != 0)
		return rc;
	return l->eventElapsedTime(ms, l->events[i], l->events[j]);
}
