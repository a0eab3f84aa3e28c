// hopper.cu: the prefill attention kernel for Hopper (compute capability
// 9.0), on the warpgroup tensor-core instructions (wgmma) that sm_80-style
// mma.sync kernels such as model.cu's kvm_flash_d128 cannot reach. It is
// compiled to PTX for compute_90a and embedded in the Go package
// (hopper.ptx), loaded only on a 9.x device; model.cu's kernels stay for
// every other GPU and for the decode step:
//
//   nvcc --ptx -gencode=arch=compute_90a,code=compute_90a -O3 \
//         -o examples/server/internal/gpu/kernels/hopper.ptx \
//         examples/server/internal/gpu/kernels/hopper.cu
//
// Shapes: head dim 128, bf16 in, fp32 accumulation and softmax, bf16 out.
// Layouts (as model.cu's): q and out are [rows][query heads][128]; the
// gathered K is [KV heads][cap][128] (kvm_gather's) and the gathered V is
// transposed, [KV heads][128][cap] (kvm_gather_t), so that both products
// read their B operand K-major, the layout wgmma takes without a
// transpose.

typedef unsigned short bf16;
typedef unsigned long long u64;
typedef unsigned int u32;

#define HD 128
#define BM 128 // query rows per CTA: two warpgroups of 64
#define BN 128 // keys per tile
#define TILE 32768 // bytes of one [128][128] bf16 operand tile in shared memory
#define THREADS 256

// ---- Shared-memory tiles in the 128-byte swizzled layout. ----
//
// A [128 rows][128] bf16 tile is stored as two column halves of 64 bf16
// (128 bytes per row), each 128 rows × 128 bytes = 16 KiB. Within a half,
// the 16-byte chunk c of row r sits at r*128 + ((c ^ r%8) * 16): the
// 128-byte swizzle wgmma's descriptors name (mode 1), which spreads the
// eight rows of a core matrix over all the banks. Tiles start on 1 KiB
// boundaries, as the swizzle pattern requires.

__device__ static inline u32 swz(int r, int c) { return (c >> 3) * 16384 + r * 128 + (((c & 7) ^ (r & 7)) << 4); }

__device__ static inline u32 smemAddr(const void *p) { return (u32)__cvta_generic_to_shared(p); }

// cp16 copies 16 bytes, of which the first n come from src (the rest are
// zero-filled: n = 0 reads nothing).
__device__ static inline void cp16(u32 dst, const void *src, int n) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n));
}

// desc is the wgmma matrix descriptor of a K-major operand whose 16-element
// slice of K starts at shared address a: 128-byte swizzle, eight-row core
// matrix groups 1024 bytes apart (the stride byte offset), the leading
// byte offset unused in this mode.
__device__ static inline u64 desc(u32 a) {
	return (u64)((a & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

// kslice is the address of K slice kk (16 elements) of a tile's row block
// starting at base: slices 0-3 in the first column half, 4-7 in the second.
__device__ static inline u32 kslice(u32 base, int kk) { return base + (kk >> 2) * 16384 + (kk & 3) * 32; }

#define D8(b)                                                                                                        \
	"+f"(d[b + 0]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]),              \
	    "+f"(d[b + 6]), "+f"(d[b + 7])
#define D64 D8(0), D8(8), D8(16), D8(24), D8(32), D8(40), D8(48), D8(56)
#define R64                                                                                                          \
	"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "  \
	"%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "    \
	"%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// mmaSS: d (64 rows × 128 columns per warpgroup, fp32) = or += A·Bᵀ over 16
// of K, both operands in shared memory.
__device__ static inline void mmaSS(float (&d)[64], u64 a, u64 b, int accumulate) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " R64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
	             : D64
	             : "l"(a), "l"(b), "r"(accumulate));
}

// mmaRS: d += A·Bᵀ over 16 of K, A (this warpgroup's 64 rows) in registers
// in the layout of an mma.m16n8k16 A fragment per warp.
__device__ static inline void mmaRS(float (&d)[64], const u32 (&a)[4], u64 b) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " R64
	             ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
	             : D64
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

__device__ static inline void wgFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ static inline void wgCommit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ static inline void wgWait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// pin keeps the compiler from moving reads of the accumulators above the
// wait that makes them valid.
__device__ static inline void pin(float (&d)[64]) {
#pragma unroll
	for (int i = 0; i < 64; i++)
		asm volatile("" : "+f"(d[i])::"memory");
}

__device__ static inline float ex2(float x) {
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}

__device__ static inline float fmax2(float a, float b) { return a > b ? a : b; }

__device__ static inline float quadMax(float v) {
	v = fmax2(v, __shfl_xor_sync(0xffffffffu, v, 1));
	return fmax2(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ static inline float quadSum(float v) {
	v += __shfl_xor_sync(0xffffffffu, v, 1);
	return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// pack2 rounds lo and hi to bf16 (nearest even) into one word, lo in the
// low half.
__device__ static inline u32 pack2(float lo, float hi) {
	u32 r;
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
	return r;
}

// loadKV starts the copy of the K and V tiles at key k0 into their shared
// tiles ks and vs: keys past maxKey are zero-filled, never read.
__device__ static inline void loadKV(u32 ks, u32 vs, const bf16 *kg, const bf16 *vg, long long cap, int k0,
                                     int maxKey) {
	const int tid = threadIdx.x;
#pragma unroll
	for (int i = 0; i < BN * HD / 8 / THREADS; i++) {
		const int idx = tid + i * THREADS, r = idx >> 4, c = idx & 15;
		// K: row r is key k0+r, chunk c its elements 8c..8c+7.
		const int key = k0 + r;
		cp16(ks + swz(r, c), kg + (long long)(key <= maxKey ? key : 0) * HD + c * 8, key <= maxKey ? 16 : 0);
		// Vᵀ: row r is dimension r, chunk c its keys k0+8c..k0+8c+7.
		const int k8 = k0 + c * 8, left = maxKey + 1 - k8;
		const int n = left >= 8 ? 16 : (left > 0 ? 2 * left : 0);
		cp16(vs + swz(r, c), vg + (long long)r * cap + (n ? k8 : 0), n);
	}
}

// kvFull starts the copy of a K and a Vᵀ tile that lies wholly below the
// CTA's last key: thread tid copies rows tid/16 + 16i, chunk tid%16, of
// both, so its shared offsets (off + 2048i) and source steps are fixed
// for the kernel's life.
__device__ static inline void kvFull(u32 ks, u32 vs, u32 off, const bf16 *k, const bf16 *v, long long vstep) {
#pragma unroll
	for (int i = 0; i < BN * HD / 8 / THREADS; i++) {
		cp16(ks + off + 2048 * i, k + i * 16 * HD, 16);
		cp16(vs + off + 2048 * i, v + i * vstep, 16);
	}
}

// softmaxTile turns a tile's raw scores s (this thread's 2 rows × 32 keys)
// into bf16 probabilities p against the rows' new running maxima, folding
// the scale into the exponent (exp2(s·sl2 - m·sl2)); it returns the
// factors that rescale what was accumulated against the old maxima.
// Keys above a row's position (tiles at or past the CTA's diagonal,
// masked) get probability 0.
__device__ static inline void softmaxTile(float (&s)[64], u32 (&p)[32], bool masked, int k0, int tig, int pA, int pB,
                                          float sl2, float &mA, float &mB, float &lA, float &lB, float &cA,
                                          float &cB) {
	const float ninf = -__int_as_float(0x7f800000);
	if (masked) {
#pragma unroll
		for (int i = 0; i < 16; i++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const int key = k0 + 8 * i + 2 * tig + e;
				if (key > pA)
					s[4 * i + e] = ninf;
				if (key > pB)
					s[4 * i + 2 + e] = ninf;
			}
	}
	float tA = mA, tB = mB;
#pragma unroll
	for (int i = 0; i < 16; i++) {
		tA = fmax2(tA, fmax2(s[4 * i], s[4 * i + 1]));
		tB = fmax2(tB, fmax2(s[4 * i + 2], s[4 * i + 3]));
	}
	tA = quadMax(tA);
	tB = quadMax(tB);
	cA = ex2((mA - tA) * sl2);
	cB = ex2((mB - tB) * sl2);
	mA = tA;
	mB = tB;
	const float oA = tA * sl2, oB = tB * sl2;
	float sumA = 0, sumB = 0;
#pragma unroll
	for (int i = 0; i < 16; i++) {
		s[4 * i] = ex2(fmaf(s[4 * i], sl2, -oA));
		s[4 * i + 1] = ex2(fmaf(s[4 * i + 1], sl2, -oA));
		s[4 * i + 2] = ex2(fmaf(s[4 * i + 2], sl2, -oB));
		s[4 * i + 3] = ex2(fmaf(s[4 * i + 3], sl2, -oB));
		sumA += s[4 * i] + s[4 * i + 1];
		sumB += s[4 * i + 2] + s[4 * i + 3];
	}
	lA = lA * cA + sumA;
	lB = lB * cB + sumB;
	// p[4kk..4kk+3]: the A fragment of keys 16kk..16kk+15 for O += P·V.
#pragma unroll
	for (int kk = 0; kk < 8; kk++) {
		p[4 * kk] = pack2(s[8 * kk], s[8 * kk + 1]);
		p[4 * kk + 1] = pack2(s[8 * kk + 2], s[8 * kk + 3]);
		p[4 * kk + 2] = pack2(s[8 * kk + 4], s[8 * kk + 5]);
		p[4 * kk + 3] = pack2(s[8 * kk + 6], s[8 * kk + 7]);
	}
}

// kvm_flash_h128: causal attention of nc computed rows over the gathered K
// and Vᵀ. Row r (position pos[r], ascending) attends to keys [0, pos[r]].
// Grid (query heads, ceil(nc/128)), 256 threads (two warpgroups of 64
// rows), HOPPER_FLASH_SMEM bytes of dynamic shared memory: Q and two
// stages of a K and a Vᵀ tile. The CTAs of the row tiles with the most
// keys run first, and those of one row tile's heads side by side, so that
// a KV head's tiles are read from L2 by its group's query heads together.
//
// Per key tile, each warpgroup computes S = Q·Kᵀ (wgmma, both from shared
// memory), the online softmax in registers (exp2 domain, running row
// maximum and sum), then O += P·V (wgmma, P from registers in bf16). The
// warpgroups take turns on the tensor cores: warpgroup 1 starts its S only
// once warpgroup 0's is done, so that one's softmax runs beside the
// other's products. The next tile's K and V load (cp.async) while S is
// multiplied. Only tiles that cross a row's diagonal are masked.
#define HOPPER_FLASH_SMEM (5 * TILE + 1024)

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    kvm_flash_h128(const bf16 *q, const bf16 *kc, const bf16 *vt, bf16 *out, const int *pos, int nc, int qh, int group,
                   long long cap, float scale) {
	extern __shared__ __align__(1024) unsigned char smem[];
	const u32 base = (smemAddr(smem) + 1023) & ~1023u;
	const u32 qs = base, stage0 = base + TILE; // stage j: K at stage0 + 2j·TILE, Vᵀ after it

	const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, gid = lane >> 2,
	          tig = lane & 3;
	const int h = blockIdx.x, g = h / group;
	const int row0 = (gridDim.y - 1 - blockIdx.y) * BM;
	const int last = (row0 + BM < nc ? row0 + BM : nc) - 1;
	const int maxKey = pos[last], minPos = pos[row0];
	const int rA = row0 + wg * 64 + warp * 16 + gid, rB = rA + 8;
	const int pA = pos[rA < nc ? rA : nc - 1], pB = pos[rB < nc ? rB : nc - 1];
	const bf16 *kg = kc + (long long)g * cap * HD, *vg = vt + (long long)g * HD * cap;
	const int lr = tid >> 4, lc = tid & 15; // this thread's row and chunk in a tile copy
	const u32 loff = swz(lr, lc);
	const bf16 *kl = kg + lr * HD + lc * 8, *vl = vg + lr * cap + lc * 8;

	// Q: row r of the tile is computed row row0+r (zero past nc).
#pragma unroll
	for (int i = 0; i < BM * HD / 8 / THREADS; i++) {
		const int idx = tid + i * THREADS, r = idx >> 4, c = idx & 15, row = row0 + r;
		cp16(qs + swz(r, c), q + ((long long)(row < nc ? row : 0) * qh + h) * HD + c * 8, row < nc ? 16 : 0);
	}
	const int tiles = maxKey / BN + 1;
	if (BN - 1 <= maxKey)
		kvFull(stage0, stage0 + TILE, loff, kl, vl, 16 * cap);
	else
		loadKV(stage0, stage0 + TILE, kg, vg, cap, 0, maxKey);
	asm volatile("cp.async.commit_group;");

	float o[64], s[64];
	u32 p[32];
#pragma unroll
	for (int i = 0; i < 64; i++)
		o[i] = 0;
	float mA = -__int_as_float(0x7f800000), mB = mA, lA = 0, lB = 0, cA, cB;
	const float sl2 = scale * 1.4426950408889634f;
	const u32 qw = qs + wg * 64 * 128; // this warpgroup's 64 rows of Q

	for (int t = 0; t < tiles; t++) {
		const int k0 = t * BN;
		const u32 ks = stage0 + 2 * (t & 1) * TILE, vs = ks + TILE;
		// Tile t has landed for every thread, and every warpgroup is done
		// with tile t-1, whose stage takes tile t+1 below.
		asm volatile("cp.async.wait_group 0;" ::: "memory");
		asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
		__syncthreads();

		if (wg == 1)
			asm volatile("bar.sync 1, 256;" ::: "memory");
		wgFence();
#pragma unroll
		for (int kk = 0; kk < HD / 16; kk++)
			mmaSS(s, desc(kslice(qw, kk)), desc(kslice(ks, kk)), kk);
		wgCommit();
		if (t + 1 < tiles) {
			const int k1 = k0 + BN;
			const u32 nk = stage0 + 2 * ((t + 1) & 1) * TILE;
			if (k1 + BN - 1 <= maxKey)
				kvFull(nk, nk + TILE, loff, kl + (long long)k1 * HD, vl + k1, 16 * cap);
			else
				loadKV(nk, nk + TILE, kg, vg, cap, k1, maxKey);
			asm volatile("cp.async.commit_group;");
		}
		wgWait0();
		pin(s);
		if (wg == 0)
			asm volatile("bar.arrive 1, 256;" ::: "memory");
		softmaxTile(s, p, k0 + BN - 1 > minPos, k0, tig, pA, pB, sl2, mA, mB, lA, lB, cA, cB);
#pragma unroll
		for (int i = 0; i < 16; i++) {
			o[4 * i] *= cA;
			o[4 * i + 1] *= cA;
			o[4 * i + 2] *= cB;
			o[4 * i + 3] *= cB;
		}
		wgFence();
#pragma unroll
		for (int kk = 0; kk < BN / 16; kk++) {
			const u32 a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
			mmaRS(o, a, desc(kslice(vs, kk)));
		}
		wgCommit();
		wgWait0();
		pin(o);
	}

	lA = quadSum(lA);
	lB = quadSum(lB);
	const float iA = 1.0f / lA, iB = 1.0f / lB;
#pragma unroll
	for (int i = 0; i < 16; i++) {
		const int d = 8 * i + 2 * tig;
		if (rA < nc)
			*(u32 *)(out + ((long long)rA * qh + h) * HD + d) = pack2(o[4 * i] * iA, o[4 * i + 1] * iA);
		if (rB < nc)
			*(u32 *)(out + ((long long)rB * qh + h) * HD + d) = pack2(o[4 * i + 2] * iB, o[4 * i + 3] * iB);
	}
}

// kvm_gather_t: kvm_gather's copy of K, [kvh][capacity][128], with V
// transposed, [kvh][128][capacity], for positions [0, n) of one layer.
// Grid (ceil(n/64), kvh), 256 threads. A tile's positions past n get zero
// V, so that no stale value sits beside the keys kvm_flash_h128 reads.
extern "C" __global__ void __launch_bounds__(256) kvm_gather_t(const char *region, const int *slots, bf16 *k, bf16 *vt,
                                                               int kvh, int bt, long long blockBytes,
                                                               long long partBytes, int layer, long long capacity,
                                                               int n) {
	__shared__ u32 sv[64][65]; // 64 positions × 128 bf16 of V, one padding word per row
	const int t0 = blockIdx.x * 64, g = blockIdx.y, tid = threadIdx.x;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const int idx = tid + i * 256, tt = idx >> 4, c = idx & 15, t = t0 + tt;
		uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
		if (t < n) {
			const char *src = region + (long long)slots[t / bt] * blockBytes + (long long)(2 * layer) * partBytes +
			                  ((long long)((t % bt) * kvh + g) * HD + c * 8) * 2;
			kv = *(const uint4 *)src;
			vv = *(const uint4 *)(src + partBytes);
			*(uint4 *)(k + ((long long)g * capacity + t) * HD + c * 8) = kv;
		}
		sv[tt][c * 4] = vv.x;
		sv[tt][c * 4 + 1] = vv.y;
		sv[tt][c * 4 + 2] = vv.z;
		sv[tt][c * 4 + 3] = vv.w;
	}
	__syncthreads();
#pragma unroll
	for (int i = 0; i < 4; i++) {
		// Chunk j: dimension d, positions t0+8pc..t0+8pc+7.
		const int j = tid + i * 256, pc = j & 7, d = j >> 3;
		u32 w[4];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const u32 lo = sv[8 * pc + 2 * e][d >> 1], hi = sv[8 * pc + 2 * e + 1][d >> 1];
			w[e] = (d & 1) ? (lo >> 16) | (hi & 0xffff0000u) : (lo & 0xffffu) | (hi << 16);
		}
		*(uint4 *)(vt + ((long long)g * HD + d) * capacity + t0 + 8 * pc) = make_uint4(w[0], w[1], w[2], w[3]);
	}
}
