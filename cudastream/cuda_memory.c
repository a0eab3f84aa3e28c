//go:build cgo

// cuda_memory.c: device memory, host registrations and pinned host
// allocations (cuMemHostAlloc, and VMM memory on a host NUMA node).

#include <string.h>

#include "cuda_driver.h"
#include "cuda_internal.h"

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
