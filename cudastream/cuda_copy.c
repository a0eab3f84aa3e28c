//go:build cgo

// cuda_copy.c: the work enqueued on a stream: copies checked against their
// device allocations (single, strided, batched), each stream's C-side state,
// the copy kernel with its descriptor ring, and the kernel modules (copy,
// FMA, word sum) with their launches.

#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"
#include "cuda_internal.h"

// Descriptors per cuMemcpyBatchAsync call. The driver starts a call's copies
// only once it has taken in the whole call (0.5-1 us per host-to-device
// descriptor on the H200), so long calls add their issue time to the copy
// time instead of overlapping it: 1 GiB of 64 KiB blocks moved host to device
// at 43.3 GiB/s in calls of 4096 and at 49.9 in calls of 256, 256 KiB blocks
// at 43.2 and 50.6 (benchmarks/results/copykernel-h200.md).
#define DRV_BATCH_CHUNK 256

// drvCheckDev checks that [p, p+n) lies inside one device allocation.
static drvResult drvCheckDev(drvTable *t, drvStreamState *st, drvCUdeviceptr p, size_t n) {
	unsigned long long gen = __atomic_load_n(&t->freeGen, __ATOMIC_ACQUIRE);
	if (st->gen != gen) {
		// The scan reads slots [0, nranges): refill from slot 0, or a
		// stale range in a low slot would answer for a new allocation.
		st->nranges = 0;
		st->next = 0;
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
		st->hnext = 0;
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
