//go:build cgo

// cuda_driver.c: the thin C layer under cuda_cgo.go. It opens libcuda.so.1,
// fills one dispatch table per device through cuGetProcAddress, and wraps each
// driver call so that the device's context is made current inside the same C
// call (goroutines move between OS threads between cgo calls). This file
// loads the driver and wraps the device, context, stream and event calls;
// cuda_memory.c wraps memory, cuda_copy.c copies and kernels.

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"
#include "cuda_internal.h"

#define DRV_GET_PROC_DEFAULT 0ULL

struct drvEntry {
	const char *sym;
	int version; // the CUDA version whose ABI the table's declaration has
	size_t off;
};

#define E(field, sym, ver) {sym, ver, offsetof(drvTable, field)}

static const struct drvEntry drvEntries[] = {
    E(init, "cuInit", 12000),
    E(driverGetVersion, "cuDriverGetVersion", 12000),
    E(deviceGetCount, "cuDeviceGetCount", 12000),
    E(deviceGet, "cuDeviceGet", 12000),
    E(deviceGetName, "cuDeviceGetName", 12000),
    E(deviceGetAttribute, "cuDeviceGetAttribute", 12000),
    E(deviceTotalMem, "cuDeviceTotalMem", 12000),
    E(deviceGetPCIBusId, "cuDeviceGetPCIBusId", 12000),
    E(primaryCtxRetain, "cuDevicePrimaryCtxRetain", 12000),
    E(primaryCtxRelease, "cuDevicePrimaryCtxRelease", 12000),
    E(ctxSetCurrent, "cuCtxSetCurrent", 12000),
    E(ctxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange", 12000),
    E(memGetInfo, "cuMemGetInfo", 12000),
    E(memAlloc, "cuMemAlloc", 12000),
    E(memFree, "cuMemFree", 12000),
    E(memGetAddressRange, "cuMemGetAddressRange", 12000),
    E(memHostRegister, "cuMemHostRegister", 12000),
    E(memHostUnregister, "cuMemHostUnregister", 12000),
    E(memHostAlloc, "cuMemHostAlloc", 12000),
    E(memFreeHost, "cuMemFreeHost", 12000),
    E(memGetAllocationGranularity, "cuMemGetAllocationGranularity", 12000),
    E(memCreate, "cuMemCreate", 12000),
    E(memRelease, "cuMemRelease", 12000),
    E(memAddressReserve, "cuMemAddressReserve", 12000),
    E(memAddressFree, "cuMemAddressFree", 12000),
    E(memMap, "cuMemMap", 12000),
    E(memUnmap, "cuMemUnmap", 12000),
    E(memSetAccess, "cuMemSetAccess", 12000),
    E(streamCreateWithPriority, "cuStreamCreateWithPriority", 12000),
    E(streamDestroy, "cuStreamDestroy", 12000),
    E(streamQuery, "cuStreamQuery", 12000),
    E(streamSynchronize, "cuStreamSynchronize", 12000),
    E(streamWaitEvent, "cuStreamWaitEvent", 12000),
    E(eventCreate, "cuEventCreate", 12000),
    E(eventRecord, "cuEventRecord", 12000),
    E(eventQuery, "cuEventQuery", 12000),
    E(eventSynchronize, "cuEventSynchronize", 12000),
    E(eventDestroy, "cuEventDestroy", 12000),
    E(eventElapsedTime, "cuEventElapsedTime", 12000),
    E(pointerGetAttribute, "cuPointerGetAttribute", 12000),
    E(moduleLoadData, "cuModuleLoadData", 12000),
    E(moduleUnload, "cuModuleUnload", 12000),
    E(moduleGetFunction, "cuModuleGetFunction", 12000),
    E(launchKernel, "cuLaunchKernel", 12000),
    E(memcpyHtoDAsync, "cuMemcpyHtoDAsync", 12000),
    E(memcpyDtoHAsync, "cuMemcpyDtoHAsync", 12000),
    E(memcpyDtoDAsync, "cuMemcpyDtoDAsync", 12000),
    E(memcpy2DAsync, "cuMemcpy2DAsync", 12000),
};

static void *drvResolve(drvTable *t, const char *sym, int version) {
	void *p = NULL;
	int status = -1; // CUdriverProcAddressQueryResult: 0 is success
	if (t->getProcAddress(sym, &p, version, DRV_GET_PROC_DEFAULT, &status) != 0 || status != 0)
		return NULL;
	return p;
}

drvTable *drvLoad(char *errbuf, size_t errlen) {
	// The caller holds the OS thread locked: dlerror's state is per thread.
	dlerror(); // clear a stale error
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		const char *e = dlerror();
		snprintf(errbuf, errlen, "dlopen: %s", e ? e : "libcuda.so.1: unknown error");
		return NULL;
	}
	dlerror();
	void *gpa = dlsym(lib, "cuGetProcAddress_v2");
	const char *e = dlerror();
	if (e != NULL || gpa == NULL) {
		snprintf(errbuf, errlen, "dlsym cuGetProcAddress_v2 (driver older than CUDA 12.0?): %s",
		         e ? e : "symbol is NULL");
		dlclose(lib);
		return NULL;
	}
	drvTable *t = calloc(1, sizeof(drvTable));
	if (t == NULL) {
		snprintf(errbuf, errlen, "calloc of the dispatch table failed");
		dlclose(lib);
		return NULL;
	}
	t->lib = lib;
	t->getProcAddress = (drvResult(*)(const char *, void **, int, unsigned long long, int *))gpa;
	dlerror();
	t->getErrorName = (drvResult(*)(drvResult, const char **))dlsym(lib, "cuGetErrorName");
	dlerror();
	t->getErrorString = (drvResult(*)(drvResult, const char **))dlsym(lib, "cuGetErrorString");
	dlerror();
	for (size_t i = 0; i < sizeof drvEntries / sizeof drvEntries[0]; i++) {
		void *p = drvResolve(t, drvEntries[i].sym, drvEntries[i].version);
		memcpy((char *)t + drvEntries[i].off, &p, sizeof p);
	}
	if (t->driverGetVersion == NULL || t->driverGetVersion(&t->driverVersion) != 0)
		t->driverVersion = 0;
	// cuMemcpyBatchAsync changed signature in CUDA 13.0 (failIdx dropped).
	// Ask for the ABI that matches the driver.
	if (t->driverVersion >= 13000) {
		void *p = drvResolve(t, "cuMemcpyBatchAsync", 13000);
		memcpy(&t->memcpyBatchAsync13, &p, sizeof p);
		if (p != NULL)
			t->batchABI = 13000;
	}
	if (t->batchABI == 0 && t->driverVersion >= 12080) {
		void *p = drvResolve(t, "cuMemcpyBatchAsync", 12080);
		memcpy(&t->memcpyBatchAsync128, &p, sizeof p);
		if (p != NULL)
			t->batchABI = 12080;
	}
	return t;
}

void drvUnload(drvTable *t) {
	// libcuda stays loaded: its own threads may still run after the last
	// context is gone, and dlclose under them is not safe.
	free(t);
}

const char *drvErrorName(drvTable *t, drvResult r) {
	const char *s = NULL;
	if (t != NULL && t->getErrorName != NULL && t->getErrorName(r, &s) == 0)
		return s;
	return NULL;
}

const char *drvErrorString(drvTable *t, drvResult r) {
	const char *s = NULL;
	if (t != NULL && t->getErrorString != NULL && t->getErrorString(r, &s) == 0)
		return s;
	return NULL;
}

drvResult drvInit(drvTable *t) {
	DRV_NEED(t, init);
	return t->init(0);
}

drvResult drvDeviceGetCount(drvTable *t, int *n) {
	DRV_NEED(t, deviceGetCount);
	return t->deviceGetCount(n);
}

drvResult drvDeviceGet(drvTable *t, int ordinal) {
	DRV_NEED(t, deviceGet);
	return t->deviceGet(&t->dev, ordinal);
}

drvResult drvDeviceName(drvTable *t, char *buf, int len) {
	DRV_NEED(t, deviceGetName);
	return t->deviceGetName(buf, len, t->dev);
}

drvResult drvTotalMem(drvTable *t, size_t *n) {
	DRV_NEED(t, deviceTotalMem);
	return t->deviceTotalMem(n, t->dev);
}

drvResult drvPCIBusID(drvTable *t, char *buf, int len) {
	DRV_NEED(t, deviceGetPCIBusId);
	return t->deviceGetPCIBusId(buf, len, t->dev);
}

drvResult drvAttr(drvTable *t, int attr, int *v) {
	DRV_NEED(t, deviceGetAttribute);
	return t->deviceGetAttribute(v, attr, t->dev);
}

drvResult drvRetainPrimary(drvTable *t) {
	DRV_NEED(t, primaryCtxRetain);
	return t->primaryCtxRetain(&t->ctx, t->dev);
}

drvResult drvReleasePrimary(drvTable *t) {
	DRV_NEED(t, primaryCtxRelease);
	return t->primaryCtxRelease(t->dev);
}

drvResult drvPriorityRange(drvTable *t, int *least, int *greatest) {
	DRV_NEED(t, ctxGetStreamPriorityRange);
	DRV_CTX(t);
	return t->ctxGetStreamPriorityRange(least, greatest);
}

drvResult drvStreamCreate(drvTable *t, drvCUstream *s, unsigned int flags, int prio) {
	DRV_NEED(t, streamCreateWithPriority);
	DRV_CTX(t);
	return t->streamCreateWithPriority(s, flags, prio);
}

drvResult drvStreamDestroy(drvTable *t, drvCUstream s) {
	DRV_NEED(t, streamDestroy);
	DRV_CTX(t);
	return t->streamDestroy(s);
}

drvResult drvStreamQuery(drvTable *t, drvCUstream s) {
	DRV_NEED(t, streamQuery);
	DRV_CTX(t);
	return t->streamQuery(s);
}

drvResult drvStreamSynchronize(drvTable *t, drvCUstream s) {
	DRV_NEED(t, streamSynchronize);
	DRV_CTX(t);
	return t->streamSynchronize(s);
}

drvResult drvStreamWaitEvent(drvTable *t, drvCUstream s, drvCUevent e) {
	DRV_NEED(t, streamWaitEvent);
	DRV_CTX(t);
	return t->streamWaitEvent(s, e, 0);
}

drvResult drvEventCreate(drvTable *t, drvCUevent *e, unsigned int flags) {
	DRV_NEED(t, eventCreate);
	DRV_CTX(t);
	return t->eventCreate(e, flags);
}

drvResult drvEventRecord(drvTable *t, drvCUevent e, drvCUstream s) {
	DRV_NEED(t, eventRecord);
	DRV_CTX(t);
	return t->eventRecord(e, s);
}

drvResult drvEventQuery(drvTable *t, drvCUevent e) {
	DRV_NEED(t, eventQuery);
	DRV_CTX(t);
	return t->eventQuery(e);
}

drvResult drvEventSynchronize(drvTable *t, drvCUevent e) {
	DRV_NEED(t, eventSynchronize);
	DRV_CTX(t);
	return t->eventSynchronize(e);
}

drvResult drvEventDestroy(drvTable *t, drvCUevent e) {
	DRV_NEED(t, eventDestroy);
	DRV_CTX(t);
	return t->eventDestroy(e);
}

drvResult drvEventElapsed(drvTable *t, float *ms, drvCUevent start, drvCUevent end) {
	DRV_NEED(t, eventElapsedTime);
	DRV_CTX(t);
	return t->eventElapsedTime(ms, start, end);
}
