// variants.cu: copy-kernel variants measured against kvtier_copy by
// TestCuCopyVariants (cudastream/copyvariants_gpu_test.go); none of them is
// embedded in the package. Each build exports its variant as kvtier_copy,
// beside copy.cu's kvtier_fma, so the package's loader takes it as is.
//
//   KV_VARIANT=1  Hopper bulk copies (sm_90): one thread per CTA streams the
//                 CTA's pieces through KV_S shared-memory stages of KV_C
//                 bytes, global->shared with cp.async.bulk completing on an
//                 mbarrier, shared->global with a bulk store. It issues
//                 almost no instructions, so it shows what the SMs' own
//                 path to PCIe allows without the load/store loop's cost.
//
//   nvcc -ptx -arch=sm_90 -DKV_VARIANT=1 -DKV_S=3 -DKV_C=12288 -o bulk.ptx variants.cu
//
// On the H200 it reached the same rate as kvtier_copy (about 46 GiB/s host
// to device, 47-48 device to host; benchmarks/results/copykernel-h200.md),
// which is why the package keeps the portable kernel.

#define kvtier_copy kvtier_copy_plain
#include "copy.cu"
#undef kvtier_copy

#ifndef KV_S
#define KV_S 3
#endif
#ifndef KV_C
#define KV_C 12288
#endif

#if KV_VARIANT == 1
__device__ __forceinline__ unsigned kvSmem(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

extern "C" __global__ void kvtier_copy(const kvPiece *pieces, unsigned int n) {
	__shared__ __align__(128) unsigned char buf[KV_S][KV_C];
	__shared__ __align__(8) unsigned long long bar[KV_S];
	if (threadIdx.x != 0)
		return;
	for (int s = 0; s < KV_S; s++)
		asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(kvSmem(&bar[s])) : "memory");
	asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
	unsigned int li = blockIdx.x;
	unsigned long long loff = 0;
	kvPiece cur;
	bool have = false;
	unsigned long long sdst[KV_S];
	unsigned int ssz[KV_S];
	unsigned int issued = 0, done = 0;
	// next yields the next chunk of this CTA's pieces; unaligned pieces are
	// copied byte by byte on the spot.
	auto next = [&](unsigned long long &dst, unsigned long long &src, unsigned int &size) -> bool {
		for (;;) {
			if (!have) {
				if (li >= n)
					return false;
				cur = pieces[li];
				loff = 0;
				have = true;
				if (((cur.dst | cur.src | (unsigned long long)cur.bytes) & 15) != 0) {
					for (long long k = 0; k < cur.bytes; k++)
						((char *)cur.dst)[k] = ((const char *)cur.src)[k];
					have = false;
					li += gridDim.x;
					continue;
				}
			}
			if (loff < (unsigned long long)cur.bytes) {
				unsigned long long left = (unsigned long long)cur.bytes - loff;
				size = left < KV_C ? (unsigned int)left : KV_C;
				dst = cur.dst + loff;
				src = cur.src + loff;
				loff += size;
				return true;
			}
			have = false;
			li += gridDim.x;
		}
	};
	auto load = [&](unsigned int st, unsigned long long src, unsigned int size) {
		unsigned long long state; // the barrier's phase token, unused: waits go by parity
		asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;"
		             : "=l"(state)
		             : "r"(kvSmem(&bar[st])), "r"(size)
		             : "memory");
		(void)state;
		asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
		                 kvSmem(buf[st])),
		             "l"(src), "r"(size), "r"(kvSmem(&bar[st]))
		             : "memory");
	};
	unsigned long long dst, src;
	unsigned int size;
	while (issued < KV_S && next(dst, src, size)) {
		load(issued, src, size);
		sdst[issued] = dst;
		ssz[issued] = size;
		issued++;
	}
	while (done < issued) {
		unsigned int st = done % KV_S, parity = (done / KV_S) & 1, ok = 0;
		do {
			asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
			             : "=r"(ok)
			             : "r"(kvSmem(&bar[st])), "r"(parity)
			             : "memory");
		} while (!ok);
		asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(sdst[st]), "r"(kvSmem(buf[st])),
		             "r"(ssz[st])
		             : "memory");
		asm volatile("cp.async.bulk.commit_group;" ::: "memory");
		done++;
		if (next(dst, src, size)) {
			asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
			load(st, src, size);
			sdst[st] = dst;
			ssz[st] = size;
			issued++;
		}
	}
	asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
#else
#error "KV_VARIANT must be 1"
#endif
