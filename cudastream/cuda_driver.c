//go:build cgo

// cuda_driver.c: the thin C layer under cuda_cgo.go. It opens libcuda.so.1,
// fills one dispatch table per device through cuGetProcAddress, and wraps each
// driver call so that the device's context is made current inside the same C
// call (goroutines move between OS threads between cgo calls).

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"

#define DRV_GET_PROC_DEFAULT 0ULL
// Descriptors per cuMemcpyBatchAsync call. The driver starts a call's copies
// only once it has taken in the whole call (0.5-1 us per host-to-device
// descriptor on the H200), so long calls add their issue time to the copy
// time instead of overlapping it: 1 GiB of 64 KiB blocks moved host to device
// at 43.3 GiB/s in calls of 4096 and at 49.9 in calls of 256, 256 KiB blocks
// at 43.2 and 50.6 (benchmarks/results/copykernel-h200.md).
#define DRV_BATCH_CHUNK 256

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

// DRV_CTX makes the device's primary context current on this thread.
#define DRV_CTX(t)                                                                                 \
	do {                                                                                           \
		if ((t)->ctxSetCurrent == NULL)                                                            \
			return DRV_MISSING;                                                                    \
		drvResult r_ = (t)->ctxSetCurrent((t)->ctx);                                               \
		if (r_ != 0)                                                                               \
			return r_ | DRV_CTX_FAILED;                                                            \
	} while (0)

#define DRV_NEED(t, fn)                                                                            \
	do {                                                                                           \
		if ((t)->fn == NULL)                                                                       \
			return DRV_MISSING;                                                                    \
	} while (0)

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

drvResult drvMemGetInfo(drvTable *t, size_t *freeb, size_t *total) {
	DRV_NEED(t, memGetInfo);
	DRV_CTX(t);
	return t->memGetInfo(freeb, total);
}

drvResult drvMemAlloc(drvTable *t, drvCUdeviceptr *p, size_t n) {
	DRV_NEED(t, memAlloc);
	DRV_CTX(t);
	return t->memAlloc(p, n);
}

drvResult drvMemFree(drvTable *t, drvCUdeviceptr p) {
	DRV_NEED(t, memFree);
	DRV_CTX(t);
	drvResult r = t->memFree(p);
	__atomic_add_fetch(&t->freeGen, 1, __ATOMIC_RELEASE);
	return r;
}

drvResult drvHostRegister(drvTable *t, uint64_t addr, size_t n, unsigned int flags) {
	DRV_NEED(t, memHostRegister);
	DRV_CTX(t);
	return t->memHostRegister((void *)(uintptr_t)addr, n, flags);
}

drvResult drvHostUnregister(drvTable *t, uint64_t addr) {
	DRV_NEED(t, memHostUnregister);
	DRV_CTX(t);
	drvResult r = t->memHostUnregister((void *)(uintptr_t)addr);
	__atomic_add_fetch(&t->hostGen, 1, __ATOMIC_RELEASE);
	return r;
}

drvResult drvHostAlloc(drvTable *t, void **p, size_t n, unsigned int flags) {
	DRV_NEED(t, memHostAlloc);
	DRV_CTX(t);
	return t->memHostAlloc(p, n, flags);
}

drvResult drvHostFree(drvTable *t, void *p) {
	DRV_NEED(t, memFreeHost);
	DRV_CTX(t);
	drvResult r = t->memFreeHost(p);
	__atomic_add_fetch(&t->hostGen, 1, __ATOMIC_RELEASE);
	return r;
}

static void drvHostNUMAProp(drvMemAllocationProp *prop, int node) {
	memset(prop, 0, sizeof *prop);
	prop->type = 1; // CU_MEM_ALLOCATION_TYPE_PINNED
	prop->requestedHandleTypes = 0;
	prop->location.type = drvLocHostNUMA;
	prop->location.id = node;
}

// Steps reported by the VMM functions, named on the Go side.
enum {
	drvStepGranularity = 1,
	drvStepCreate,
	drvStepReserve,
	drvStepMap,
	drvStepAccessDevice,
	drvStepAccessHost,
	drvStepUnmap,
	drvStepAddressFree,
	drvStepRelease,
};

drvResult drvProbeHostNUMA(drvTable *t, int node, int *step) {
	DRV_NEED(t, memGetAllocationGranularity);
	DRV_NEED(t, memCreate);
	DRV_NEED(t, memRelease);
	DRV_CTX(t);
	drvMemAllocationProp prop;
	drvHostNUMAProp(&prop, node);
	size_t gran = 0;
	*step = drvStepGranularity;
	drvResult r = t->memGetAllocationGranularity(&gran, &prop, 0);
	if (r != 0)
		return r;
	drvCUhandle h = 0;
	*step = drvStepCreate;
	r = t->memCreate(&h, gran, &prop, 0);
	if (r != 0)
		return r;
	*step = drvStepRelease;
	return t->memRelease(h);
}

drvResult drvHostAllocVMM(drvTable *t, size_t n, int node, drvCUdeviceptr *ptr, drvCUhandle *h,
                          size_t *mapped, void **addr, int *step) {
	DRV_NEED(t, memGetAllocationGranularity);
	DRV_NEED(t, memCreate);
	DRV_NEED(t, memRelease);
	DRV_NEED(t, memAddressReserve);
	DRV_NEED(t, memAddressFree);
	DRV_NEED(t, memMap);
	DRV_NEED(t, memUnmap);
	DRV_NEED(t, memSetAccess);
	DRV_CTX(t);
	drvMemAllocationProp prop;
	drvHostNUMAProp(&prop, node);
	size_t gran = 0;
	*step = drvStepGranularity;
	drvResult r = t->memGetAllocationGranularity(&gran, &prop, 0);
	if (r != 0)
		return r;
	if (gran == 0)
		gran = 2 << 20;
	size_t size = (n + gran - 1) / gran * gran;
	*step = drvStepCreate;
	r = t->memCreate(h, size, &prop, 0);
	if (r != 0)
		return r;
	*step = drvStepReserve;
	r = t->memAddressReserve(ptr, size, gran, 0, 0);
	if (r != 0)
		goto release;
	*step = drvStepMap;
	r = t->memMap(*ptr, size, 0, *h, 0);
	if (r != 0)
		goto unreserve;
	drvMemAccessDesc acc;
	acc.location.type = drvLocDevice;
	acc.location.id = t->dev;
	acc.flags = 3; // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	*step = drvStepAccessDevice;
	r = t->memSetAccess(*ptr, size, &acc, 1);
	if (r != 0)
		goto unmap;
	// The CPU's access: named by the NUMA node the memory lives on; drivers
	// that only know the plain HOST location get that instead.
	acc.location.type = drvLocHostNUMA;
	acc.location.id = node;
	*step = drvStepAccessHost;
	r = t->memSetAccess(*ptr, size, &acc, 1);
	if (r != 0) {
		acc.location.type = drvLocHost;
		acc.location.id = 0;
		if (t->memSetAccess(*ptr, size, &acc, 1) != 0)
			goto unmap;
		r = 0;
	}
	*mapped = size;
	*addr = (void *)(uintptr_t)*ptr;
	return 0;
unmap:
	t->memUnmap(*ptr, size);
unreserve:
	t->memAddressFree(*ptr, size);
release:
	t->memRelease(*h);
	return r;
}

drvResult drvHostFreeVMM(drvTable *t, drvCUdeviceptr ptr, size_t mapped, drvCUhandle h, int *step) {
	DRV_NEED(t, memUnmap);
	DRV_NEED(t, memAddressFree);
	DRV_NEED(t, memRelease);
	DRV_CTX(t);
	__atomic_add_fetch(&t->hostGen, 1, __ATOMIC_RELEASE);
	drvResult first = 0;
	drvResult r = t->memUnmap(ptr, mapped);
	if (r != 0 && first == 0) {
		first = r;
		*step = drvStepUnmap;
	}
	r = t->memAddressFree(ptr, mapped);
	if (r != 0 && first == 0) {
		first = r;
		*step = drvStepAddressFree;
	}
	r = t->memRelease(h);
	if (r != 0 && first == 0) {
		first = r;
		*step = drvStepRelease;
	}
	return first;
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

// drvCheckDev checks that [p, p+n) lies inside one device allocation.
static drvResult drvCheckDev(drvTable *t, drvStreamState *st, drvCUdeviceptr p, size_t n) {
	unsigned long long gen = __atomic_load_n(&t->freeGen, __ATOMIC_ACQUIRE);
	if (st->gen != gen) {
		st->nranges = 0;
		st->gen = gen;
	}
	for (unsigned i = 0; i < st->nranges; i++) {
		drvRange *r = &st->ranges[i];
		if (p >= r->base && p - r->base < r->size)
			return n <= r->size - (p - r->base) ? 0 : DRV_OUT_OF_RANGE;
	}
	if (t->memGetAddressRange == NULL)
		return 0; // cannot check: trust the caller
	drvCUdeviceptr base = 0;
	size_t size = 0;
	drvResult r = t->memGetAddressRange(&base, &size, p);
	if (r != 0)
		return r | DRV_NOT_DEVICE;
	st->ranges[st->next] = (drvRange){base, size};
	st->next = (st->next + 1) % DRV_RANGE_CACHE;
	if (st->nranges < DRV_RANGE_CACHE)
		st->nranges++;
	return n <= size - (p - base) ? 0 : DRV_OUT_OF_RANGE;
}

// drvCheckCopy checks the device side(s) of one copy of the given kind.
static drvResult drvCheckCopy(drvTable *t, drvStreamState *st, int kind, const drvCopy *c) {
	drvResult r = 0;
	if (kind != 1)
		r = drvCheckDev(t, st, c->dst, (size_t)c->bytes);
	if (r == 0 && kind != 0)
		r = drvCheckDev(t, st, c->src, (size_t)c->bytes);
	return r;
}

static drvResult drvCopyOne(drvTable *t, int kind, const drvCopy *c, drvCUstream s) {
	switch (kind) {
	case 0:
		return t->memcpyHtoDAsync(c->dst, (const void *)(uintptr_t)c->src, (size_t)c->bytes, s);
	case 1:
		return t->memcpyDtoHAsync((void *)(uintptr_t)c->dst, c->src, (size_t)c->bytes, s);
	default:
		return t->memcpyDtoDAsync(c->dst, c->src, (size_t)c->bytes, s);
	}
}

static drvResult drvCopySingle(drvTable *t, drvStreamState *st, int kind, const drvCopy *c, drvCUstream s) {
	DRV_NEED(t, memcpyHtoDAsync);
	DRV_NEED(t, memcpyDtoHAsync);
	DRV_NEED(t, memcpyDtoDAsync);
	DRV_CTX(t);
	drvResult r = drvCheckCopy(t, st, kind, c);
	if (r != 0)
		return r;
	return drvCopyOne(t, kind, c, s);
}

drvResult drvCopyHtoD(drvTable *t, drvStreamState *st, drvCUdeviceptr dst, uint64_t src, size_t n, drvCUstream s) {
	drvCopy c = {dst, src, (int64_t)n};
	return drvCopySingle(t, st, 0, &c, s);
}

drvResult drvCopyDtoH(drvTable *t, drvStreamState *st, uint64_t dst, drvCUdeviceptr src, size_t n, drvCUstream s) {
	drvCopy c = {dst, src, (int64_t)n};
	return drvCopySingle(t, st, 1, &c, s);
}

drvResult drvCopyDtoD(drvTable *t, drvStreamState *st, drvCUdeviceptr dst, drvCUdeviceptr src, size_t n,
                      drvCUstream s) {
	drvCopy c = {dst, src, (int64_t)n};
	return drvCopySingle(t, st, 2, &c, s);
}

// drvCopy2DAsync enqueues one strided copy (cuMemcpy2DAsync) after checking
// its device side: the rows from the first byte to the last's end lie in
// one allocation.
drvResult drvCopy2DAsync(drvTable *t, drvStreamState *st, int kind, const drvCopy2D *c, drvCUstream s) {
	DRV_NEED(t, memcpy2DAsync);
	DRV_CTX(t);
	size_t w = (size_t)c->width, h = (size_t)c->height;
	drvMemcpy2D m;
	memset(&m, 0, sizeof m);
	m.widthInBytes = w;
	m.height = h;
	m.srcPitch = (size_t)c->srcPitch;
	m.dstPitch = (size_t)c->dstPitch;
	drvResult r = 0;
	if (kind == 0) {
		m.srcMemoryType = 1;
		m.srcHost = (const void *)(uintptr_t)c->src;
	} else {
		m.srcMemoryType = 2;
		m.srcDevice = c->src;
		r = drvCheckDev(t, st, c->src, m.srcPitch * (h - 1) + w);
	}
	if (kind == 1) {
		m.dstMemoryType = 1;
		m.dstHost = (void *)(uintptr_t)c->dst;
	} else {
		m.dstMemoryType = 2;
		m.dstDevice = c->dst;
		if (r == 0)
			r = drvCheckDev(t, st, c->dst, m.dstPitch * (h - 1) + w);
	}
	if (r != 0)
		return r;
	return t->memcpy2DAsync(&m, s);
}

static int drvBatchGrow(drvStreamState *b, size_t n) {
	if (n <= b->cap)
		return 0;
	size_t c = b->cap ? b->cap : 64;
	while (c < n)
		c *= 2;
	drvCUdeviceptr *d = realloc(b->dsts, c * sizeof *d);
	if (d == NULL)
		return -1;
	b->dsts = d;
	drvCUdeviceptr *s = realloc(b->srcs, c * sizeof *s);
	if (s == NULL)
		return -1;
	b->srcs = s;
	size_t *z = realloc(b->sizes, c * sizeof *z);
	if (z == NULL)
		return -1;
	b->sizes = z;
	size_t *x = realloc(b->index, c * sizeof *x);
	if (x == NULL)
		return -1;
	b->index = x;
	b->cap = c;
	return 0;
}

void drvStreamStateFree(drvTable *t, drvStreamState *b) {
	if (b == NULL)
		return;
	if (b->kcap != 0 && t->ctxSetCurrent != NULL && t->ctxSetCurrent(t->ctx) == 0) {
		// The ring is released only after the launches that read it
		// completed (invariant 3); cuMemFree would wait too, but the
		// pinned slots need the events.
		for (unsigned i = 0; i < b->kslots; i++) {
			if (b->kev[i] == NULL)
				continue;
			if (b->kused[i])
				t->eventSynchronize(b->kev[i]);
			t->eventDestroy(b->kev[i]);
		}
		if (b->khost != NULL) {
			t->memFreeHost(b->khost);
			__atomic_add_fetch(&t->hostGen, 1, __ATOMIC_RELEASE);
		}
		if (b->kdev != 0) {
			t->memFree(b->kdev);
			__atomic_add_fetch(&t->freeGen, 1, __ATOMIC_RELEASE);
		}
	}
	free(b->dsts);
	free(b->srcs);
	free(b->sizes);
	free(b->index);
	free(b);
}

drvResult drvCopyBatch(drvTable *t, drvStreamState *b, drvCUstream s, int kind, const drvCopy *ops, size_t n,
                       size_t *failIdx) {
	*failIdx = SIZE_MAX;
	DRV_NEED(t, memcpyHtoDAsync);
	DRV_NEED(t, memcpyDtoHAsync);
	DRV_NEED(t, memcpyDtoDAsync);
	DRV_CTX(t);
	// Check every descriptor before enqueuing any, so that a bad one
	// leaves the stream as it was.
	for (size_t i = 0; i < n && !t->batchNoCheck; i++) {
		if (ops[i].bytes == 0)
			continue;
		drvResult r = drvCheckCopy(t, b, kind, &ops[i]);
		if (r != 0) {
			*failIdx = i;
			return r;
		}
	}
	if (t->batchABI == 0) {
		for (size_t i = 0; i < n; i++) {
			if (ops[i].bytes == 0)
				continue;
			drvResult r = drvCopyOne(t, kind, &ops[i], s);
			if (r != 0) {
				*failIdx = i;
				return r;
			}
		}
		return 0;
	}

	drvMemcpyAttributes attr;
	memset(&attr, 0, sizeof attr);
	attr.srcAccessOrder = t->batchOrder ? t->batchOrder : 1; // CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
	attr.flags = t->batchFlags;
	if (!t->batchNoHints) {
		drvMemLocation host = {drvLocHost, 0}, dev = {drvLocDevice, t->dev};
		attr.srcLocHint = kind == 0 ? host : dev;
		attr.dstLocHint = kind == 1 ? host : dev;
	}
	size_t attrIdx = 0;

	size_t chunk = t->batchChunk ? t->batchChunk : DRV_BATCH_CHUNK;
	if (n < chunk)
		chunk = n;
	if (drvBatchGrow(b, chunk) != 0)
		return DRV_NOMEM;
	size_t i = 0;
	while (i < n) {
		// Pack up to one chunk of non-empty copies; the driver rejects
		// zero-sized ones, which are no-ops anyway.
		size_t k = 0;
		for (; i < n && k < chunk; i++) {
			if (ops[i].bytes == 0)
				continue;
			b->dsts[k] = ops[i].dst;
			b->srcs[k] = ops[i].src;
			b->sizes[k] = (size_t)ops[i].bytes;
			b->index[k] = i;
			k++;
		}
		if (k == 0)
			break;
		drvResult r;
		if (k == 1) {
			drvCopy one = {b->dsts[0], b->srcs[0], (int64_t)b->sizes[0]};
			r = drvCopyOne(t, kind, &one, s);
			if (r != 0)
				*failIdx = b->index[0];
		} else if (t->batchABI == 13000) {
			r = t->memcpyBatchAsync13(b->dsts, b->srcs, b->sizes, k, &attr, &attrIdx, 1, s);
		} else {
			size_t fi = SIZE_MAX;
			r = t->memcpyBatchAsync128(b->dsts, b->srcs, b->sizes, k, &attr, &attrIdx, 1, &fi, s);
			if (r != 0 && fi < k)
				*failIdx = b->index[fi];
		}
		if (r != 0)
			return r;
	}
	return 0;
}

// ---- the copy kernel ----

#define DRV_ATTR_HOST_PTR_FOR_REGISTERED 91 // CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
#define DRV_PTR_DEVICE_POINTER 3            // CU_POINTER_ATTRIBUTE_DEVICE_POINTER
#define DRV_PTR_RANGE_START 11              // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
#define DRV_PTR_RANGE_SIZE 12               // CU_POINTER_ATTRIBUTE_RANGE_SIZE

// Steps reported by the kernel functions, named on the Go side.
enum {
	drvKStepAttr = 1,
	drvKStepLoad,
	drvKStepGetCopy,
	drvKStepGetFMA,
	drvKStepRingHost,
	drvKStepRingDev,
	drvKStepRingEvent,
	drvKStepWaitSlot,
	drvKStepCopyDesc,
	drvKStepLaunch,
	drvKStepRecord,
	drvKStepCheckDev,
	drvKStepCheckHost,
};

drvResult drvLoadCopyModule(drvTable *t, const char *ptx, int *hostPtr, int *step) {
	DRV_NEED(t, moduleLoadData);
	DRV_NEED(t, moduleGetFunction);
	DRV_NEED(t, moduleUnload);
	DRV_NEED(t, launchKernel);
	DRV_NEED(t, deviceGetAttribute);
	DRV_CTX(t);
	*step = drvKStepAttr;
	*hostPtr = 0;
	drvResult r = t->deviceGetAttribute(hostPtr, DRV_ATTR_HOST_PTR_FOR_REGISTERED, t->dev);
	if (r != 0)
		return r;
	drvCUmodule m = NULL;
	*step = drvKStepLoad;
	r = t->moduleLoadData(&m, ptx);
	if (r != 0)
		return r;
	drvCUfunction fc = NULL, ff = NULL;
	*step = drvKStepGetCopy;
	r = t->moduleGetFunction(&fc, m, "kvtier_copy");
	if (r == 0) {
		*step = drvKStepGetFMA;
		r = t->moduleGetFunction(&ff, m, "kvtier_fma");
	}
	if (r != 0) {
		t->moduleUnload(m);
		return r;
	}
	t->copyModule = m;
	t->copyFn = fc;
	t->fmaFn = ff;
	return 0;
}

drvResult drvUnloadCopyModule(drvTable *t) {
	if (t->copyModule == NULL)
		return 0;
	DRV_NEED(t, moduleUnload);
	DRV_CTX(t);
	drvResult r = t->moduleUnload(t->copyModule);
	t->copyModule = NULL;
	t->copyFn = t->fmaFn = NULL;
	return r;
}

drvResult drvLoadSumModule(drvTable *t, const char *ptx, int *step) {
	DRV_NEED(t, moduleLoadData);
	DRV_NEED(t, moduleGetFunction);
	DRV_NEED(t, moduleUnload);
	DRV_NEED(t, launchKernel);
	DRV_CTX(t);
	drvCUmodule m = NULL;
	*step = drvKStepLoad;
	drvResult r = t->moduleLoadData(&m, ptx);
	if (r != 0)
		return r;
	drvCUfunction f = NULL;
	*step = drvKStepGetCopy;
	r = t->moduleGetFunction(&f, m, "kvtier_wordsum");
	if (r != 0) {
		t->moduleUnload(m);
		return r;
	}
	t->sumModule = m;
	t->sumFn = f;
	return 0;
}

drvResult drvUnloadSumModule(drvTable *t) {
	if (t->sumModule == NULL)
		return 0;
	DRV_NEED(t, moduleUnload);
	DRV_CTX(t);
	drvResult r = t->moduleUnload(t->sumModule);
	t->sumModule = NULL;
	t->sumFn = NULL;
	return r;
}

// drvSumBlocks has kvtier_wordsum's kvSumBlocks layout.
typedef struct {
	int ids[256];
} drvSumBlocks;

drvResult drvLaunchWordSum(drvTable *t, drvCUstream s, drvCUdeviceptr bases, unsigned pieces,
                           unsigned long long pieceWords, unsigned long long blockStride, const int *ids, unsigned n,
                           unsigned long long chunkWords, unsigned chunks, unsigned threads, drvCUdeviceptr partials) {
	if (t->sumFn == NULL)
		return DRV_NO_MODULE;
	if (n == 0 || n > 256)
		return 1; // CUDA_ERROR_INVALID_VALUE: the Go side checks n first
	DRV_NEED(t, launchKernel);
	DRV_CTX(t);
	drvSumBlocks b;
	memset(&b, 0, sizeof b);
	memcpy(b.ids, ids, n * sizeof(int));
	void *params[] = {&bases, &pieces, &pieceWords, &blockStride, &b, &chunkWords, &partials};
	return t->launchKernel(t->sumFn, chunks, pieces, n, threads, 1, 1, 0, s, params, NULL);
}

// drvCheckHost checks that the GPU reaches [p, p+n) at the host's own
// address: pinned host memory mapped for the device (registered with
// DEVICEMAP, cuMemHostAlloc'd, or VMM memory the device may access).
static drvResult drvCheckHost(drvTable *t, drvStreamState *st, uint64_t p, size_t n) {
	unsigned long long gen = __atomic_load_n(&t->hostGen, __ATOMIC_ACQUIRE);
	if (st->hgen != gen) {
		st->nhranges = 0;
		st->hgen = gen;
	}
	for (unsigned i = 0; i < st->nhranges; i++) {
		drvRange *r = &st->hranges[i];
		if (p >= r->base && p - r->base < r->size)
			return n <= r->size - (p - r->base) ? 0 : DRV_OUT_OF_RANGE;
	}
	DRV_NEED(t, pointerGetAttribute);
	drvCUdeviceptr dp = 0;
	drvResult r = t->pointerGetAttribute(&dp, DRV_PTR_DEVICE_POINTER, p);
	if (r != 0)
		return r | DRV_NOT_HOST;
	if (dp != p)
		return DRV_HOST_UNMAPPED;
	drvCUdeviceptr base = 0;
	size_t size = 0;
	if (t->pointerGetAttribute(&base, DRV_PTR_RANGE_START, p) == 0 &&
	    t->pointerGetAttribute(&size, DRV_PTR_RANGE_SIZE, p) == 0 && size > 0 && p >= base && p - base < size) {
		st->hranges[st->hnext] = (drvRange){base, size};
		st->hnext = (st->hnext + 1) % DRV_RANGE_CACHE;
		if (st->nhranges < DRV_RANGE_CACHE)
			st->nhranges++;
		return n <= size - (p - base) ? 0 : DRV_OUT_OF_RANGE;
	}
	// The driver gave no range: check the last byte as well, uncached.
	uint64_t last = p + n - 1;
	r = t->pointerGetAttribute(&dp, DRV_PTR_DEVICE_POINTER, last);
	if (r != 0)
		return r | DRV_NOT_HOST;
	return dp == last ? 0 : DRV_HOST_UNMAPPED;
}

static drvResult drvKernelRing(drvTable *t, drvStreamState *st, const drvKernelOpts *o, int *step) {
	if (st->kcap != 0)
		return 0;
	unsigned slots = o->launches;
	if (slots < 1 || slots > DRV_KRING_MAX || o->pieces < 1)
		return 1; // CUDA_ERROR_INVALID_VALUE: the Go side checks these
	size_t bytes = (size_t)slots * o->pieces * sizeof(drvCopy);
	void *h = NULL;
	*step = drvKStepRingHost;
	drvResult r = t->memHostAlloc(&h, bytes, 0x01 | 0x02); // PORTABLE | DEVICEMAP
	if (r != 0)
		return r;
	drvCUdeviceptr d = 0;
	*step = drvKStepRingDev;
	r = t->memAlloc(&d, bytes);
	if (r != 0) {
		t->memFreeHost(h);
		return r;
	}
	for (unsigned i = 0; i < slots; i++) {
		*step = drvKStepRingEvent;
		r = t->eventCreate(&st->kev[i], 0x02); // DISABLE_TIMING
		if (r != 0) {
			for (unsigned j = 0; j < i; j++) {
				t->eventDestroy(st->kev[j]);
				st->kev[j] = NULL;
			}
			t->memFree(d);
			t->memFreeHost(h);
			return r;
		}
		st->kused[i] = 0;
	}
	st->khost = h;
	st->kdev = d;
	// The slots as the device reaches them, for launches that read their
	// descriptors over the link (DEVICEMAP above); 0 if the driver says
	// nothing, and such launches then copy as the others do.
	drvCUdeviceptr m = 0;
	if (t->pointerGetAttribute != NULL && t->pointerGetAttribute(&m, DRV_PTR_DEVICE_POINTER, (uint64_t)(uintptr_t)h) != 0)
		m = 0;
	st->kmapped = m;
	st->knext = 0;
	st->kslots = slots;
	st->kcap = o->pieces;
	return 0;
}

// drvKernelFlush copies k pieces of the current slot to the device and
// launches the kernel on them, then records the slot's event.
static drvResult drvKernelFlush(drvTable *t, drvStreamState *st, drvCUstream s, size_t k, const drvKernelOpts *o,
                                int *step) {
	unsigned slot = st->knext;
	drvCopy *h = st->khost + (size_t)slot * st->kcap;
	drvCUdeviceptr off = (drvCUdeviceptr)slot * st->kcap * sizeof(drvCopy);
	drvCUdeviceptr d = st->kdev + off;
	drvResult r = 0;
	if (o->mapped && st->kmapped != 0) {
		// The kernel reads the slot over the link: no copy queued behind
		// the copy engines' work.
		d = st->kmapped + off;
	} else {
		*step = drvKStepCopyDesc;
		r = t->memcpyHtoDAsync(d, h, k * sizeof(drvCopy), s);
		if (r != 0)
			return r;
	}
	unsigned grid = o->ctas;
	if (grid > k)
		grid = (unsigned)k;
	unsigned n = (unsigned)k;
	void *params[] = {&d, &n};
	*step = drvKStepLaunch;
	r = t->launchKernel(t->copyFn, grid, 1, 1, o->threads, 1, 1, 0, s, params, NULL);
	// The event is recorded even after a failed launch: the slot's
	// descriptor copy may be in flight and must complete before reuse.
	drvResult re = t->eventRecord(st->kev[slot], s);
	st->kused[slot] = 1;
	st->knext = (slot + 1) % st->kslots;
	if (r != 0)
		return r;
	*step = drvKStepRecord;
	return re;
}

drvResult drvCopyKernel(drvTable *t, drvStreamState *st, drvCUstream s, int kind, const drvCopy *ops, size_t n,
                        const drvKernelOpts *o, size_t *failIdx, int *step) {
	*failIdx = SIZE_MAX;
	*step = 0;
	if (t->copyFn == NULL)
		return DRV_NO_MODULE;
	DRV_NEED(t, memcpyHtoDAsync);
	DRV_NEED(t, launchKernel);
	DRV_NEED(t, eventRecord);
	DRV_NEED(t, eventSynchronize);
	DRV_NEED(t, eventQuery);
	DRV_CTX(t);
	// The kernel would fault (and take the context down with it) on an
	// address it cannot reach: check every descriptor before enqueuing any.
	for (size_t i = 0; i < n; i++) {
		const drvCopy *c = &ops[i];
		if (c->bytes == 0)
			continue;
		drvResult r = 0;
		*step = drvKStepCheckDev;
		if (kind != 1)
			r = drvCheckDev(t, st, c->dst, (size_t)c->bytes);
		if (r == 0 && kind != 0)
			r = drvCheckDev(t, st, c->src, (size_t)c->bytes);
		if (r == 0 && kind != 2) {
			*step = drvKStepCheckHost;
			r = drvCheckHost(t, st, kind == 0 ? c->src : c->dst, (size_t)c->bytes);
		}
		if (r != 0) {
			*failIdx = i;
			return r;
		}
	}
	drvResult r = drvKernelRing(t, st, o, step);
	if (r != 0)
		return r;
	size_t piece = o->pieceBytes;
	size_t k = 0;
	drvCopy *h = NULL;
	for (size_t i = 0; i < n; i++) {
		uint64_t off = 0, bytes = (uint64_t)ops[i].bytes;
		while (off < bytes) {
			if (k == 0) {
				// Take the next slot once the launch that last read it
				// has completed (invariant 3).
				unsigned slot = st->knext;
				if (st->kused[slot]) {
					*step = drvKStepWaitSlot;
					r = t->eventQuery(st->kev[slot]);
					if (r == 600) // CUDA_ERROR_NOT_READY
						r = t->eventSynchronize(st->kev[slot]);
					if (r != 0)
						return r;
					st->kused[slot] = 0;
				}
				h = st->khost + (size_t)slot * st->kcap;
			}
			uint64_t len = bytes - off;
			if (len > piece)
				len = piece;
			h[k].dst = ops[i].dst + off;
			h[k].src = ops[i].src + off;
			h[k].bytes = (int64_t)len;
			k++;
			off += len;
			if (k == st->kcap) {
				r = drvKernelFlush(t, st, s, k, o, step);
				if (r != 0)
					return r;
				k = 0;
			}
		}
	}
	if (k > 0)
		return drvKernelFlush(t, st, s, k, o, step);
	return 0;
}

drvResult drvLaunchFMA(drvTable *t, drvCUstream s, drvCUdeviceptr out, unsigned grid, unsigned threads,
                       unsigned iters) {
	if (t->fmaFn == NULL)
		return DRV_NO_MODULE;
	DRV_NEED(t, launchKernel);
	DRV_CTX(t);
	void *params[] = {&out, &iters};
	return t->launchKernel(t->fmaFn, grid, 1, 1, threads, 1, 1, 0, s, params, NULL);
}
