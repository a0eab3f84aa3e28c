// model.cu: the model's device kernels (everything but the matrix products,
// which cuBLAS does), compiled to PTX and embedded in the Go package
// (model.ptx, loaded with cuModuleLoadData). No CUDA header is needed: bf16
// values are converted by bit operations, rounding to nearest even as the Go
// reference (model.ToBF16) does, and the few math functions come from NVVM
// builtins. Floating-point contraction is off so that a*b - c*d rounds as in
// Go.
//
//   clang-14 -x cuda --cuda-device-only -nocudainc -nocudalib --cuda-gpu-arch=sm_80 \
//         -Xclang -target-feature -Xclang +ptx70 -O3 -ffp-contract=off -S -o examples/server/internal/gpu/kernels/model.ptx \
//         examples/server/internal/gpu/kernels/model.cu
//
// Layouts (see package model's doc): activations are row-major, one row per
// computed token; the KV region is block-first, a (layer, part) of a block
// being [BlockTokens][KVHeads][HeadDim] bf16; the attention scratch holds K
// and V as [KVHeads][context][HeadDim].

#define G __attribute__((global))
#define D __attribute__((device))
#define S __attribute__((shared))
#define TID __nvvm_read_ptx_sreg_tid_x()
#define NTID __nvvm_read_ptx_sreg_ntid_x()
#define CTA __nvvm_read_ptx_sreg_ctaid_x()
#define CTAY __nvvm_read_ptx_sreg_ctaid_y()
#define NCTA __nvvm_read_ptx_sreg_nctaid_x()
#define SYNC() __syncthreads()

typedef unsigned short bf16;
typedef unsigned long long u64;
typedef unsigned int vec4 __attribute__((ext_vector_type(4)));

D static inline float bf2f(bf16 h) {
	union {
		unsigned u;
		float f;
	} v;
	v.u = ((unsigned)h) << 16;
	return v.f;
}

D static inline bf16 f2bf(float f) {
	union {
		unsigned u;
		float f;
	} v;
	v.f = f;
	unsigned u = v.u;
	u += 0x7fffu + ((u >> 16) & 1u);
	return (bf16)(u >> 16);
}

D static inline float kexp(float x) { return __nvvm_ex2_approx_f(x * 1.4426950408889634f); }

// blockSum reduces v over the CTA (NTID a power of two, at most 1024).
D static float blockSum(float v, float *sh) {
	const unsigned t = TID;
	sh[t] = v;
	SYNC();
	for (unsigned s = NTID / 2; s > 0; s >>= 1) {
		if (t < s)
			sh[t] += sh[t + s];
		SYNC();
	}
	float r = sh[0];
	SYNC();
	return r;
}

D static float blockMax(float v, float *sh) {
	const unsigned t = TID;
	sh[t] = v;
	SYNC();
	for (unsigned s = NTID / 2; s > 0; s >>= 1) {
		if (t < s && sh[t + s] > sh[t])
			sh[t] = sh[t + s];
		SYNC();
	}
	float r = sh[0];
	SYNC();
	return r;
}

// kvm_init_weights: model.Value for elements [0, n) of tensor id.
extern "C" G void kvm_init_weights(bf16 *dst, u64 n, u64 seed, unsigned id, int lim, float scale, float offset) {
	for (u64 i = (u64)CTA * NTID + TID; i < n; i += (u64)NCTA * NTID) {
		u64 x = seed ^ ((u64)id << 48) ^ i;
		x += 0x9E3779B97F4A7C15ull;
		x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
		x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
		x ^= x >> 31;
		int k = (int)((unsigned)(x >> 32) % (unsigned)(2 * lim + 1)) - lim;
		dst[i] = f2bf((float)k * scale + offset);
	}
}

// kvm_embed: x[i] = embedding row tokens[i], widened to float. Grid: rows.
extern "C" G void kvm_embed(const int *tokens, const bf16 *emb, float *x, int h) {
	const u64 i = CTA;
	const bf16 *e = emb + (u64)tokens[i] * h;
	for (int j = TID; j < h; j += NTID)
		x[i * h + j] = bf2f(e[j]);
}

// kvm_rmsnorm: y[i] = bf16(x[i] / rms(x[i]) * w). Grid: rows; 256 threads.
extern "C" G void kvm_rmsnorm(const float *x, const bf16 *w, bf16 *y, int h, float eps) {
	S float sh[1024];
	const float *r = x + (u64)CTA * h;
	float ss = 0;
	for (int j = TID; j < h; j += NTID)
		ss += r[j] * r[j];
	ss = blockSum(ss, sh);
	const float inv = __nvvm_div_rn_f(1.0f, __nvvm_sqrt_rn_f(ss / (float)h + eps));
	bf16 *o = y + (u64)CTA * h;
	for (int j = TID; j < h; j += NTID)
		o[j] = f2bf(r[j] * inv * bf2f(w[j]));
}

// kvm_rope_store: rotates the q and k heads of row i (position pos[i]) in
// rotate-half form with the shared tables, writes q to q[i] and k, v into
// the position's block. Grid: rows.
extern "C" G void kvm_rope_store(const bf16 *qkv, bf16 *q, char *region, const int *pos, const int *slots,
                                 const float *cosT, const float *sinT, int qh, int kvh, int hd, int bt,
                                 long long blockBytes, long long partBytes, int layer) {
	const u64 i = CTA;
	const int half = hd / 2, width = (qh + 2 * kvh) * hd, p = pos[i];
	const bf16 *row = qkv + i * width;
	char *blk = region + (long long)slots[p / bt] * blockBytes + (long long)(2 * layer) * partBytes;
	const long long tokOff = (long long)((p % bt) * kvh) * hd * 2;
	const float *cs = cosT + (u64)p * half, *sn = sinT + (u64)p * half;
	for (int idx = TID; idx < (qh + kvh) * half; idx += NTID) {
		const int hh = idx / half, d = idx % half;
		const bf16 *src = row + hh * hd;
		const float a = bf2f(src[d]), b = bf2f(src[d + half]);
		const bf16 oa = f2bf(a * cs[d] - b * sn[d]), ob = f2bf(b * cs[d] + a * sn[d]);
		bf16 *dst;
		if (hh < qh)
			dst = q + i * qh * hd + hh * hd;
		else
			dst = (bf16 *)(blk + tokOff) + (hh - qh) * hd;
		dst[d] = oa;
		dst[d + half] = ob;
	}
	bf16 *v = (bf16 *)(blk + partBytes + tokOff);
	for (int idx = TID; idx < kvh * hd; idx += NTID)
		v[idx] = row[(qh + kvh) * hd + idx];
}

// kvm_gather: copies K and V of positions [0, n) of one layer from their
// blocks into k, v laid out [kvh][capacity][hd]. Grid: positions; 16-byte
// vectors (hd a multiple of 8).
extern "C" G void kvm_gather(const char *region, const int *slots, bf16 *k, bf16 *v, int kvh, int hd, int bt,
                             long long blockBytes, long long partBytes, int layer, long long capacity) {
	const int t = CTA;
	const char *blk = region + (long long)slots[t / bt] * blockBytes + (long long)(2 * layer) * partBytes +
	                  (long long)((t % bt) * kvh) * hd * 2;
	const vec4 *sk = (const vec4 *)blk, *sv = (const vec4 *)(blk + partBytes);
	const int vecs = kvh * hd / 8;
	for (int idx = TID; idx < vecs; idx += NTID) {
		const int g = idx * 8 / hd, d = idx * 8 % hd;
		const u64 off = ((u64)g * capacity + t) * hd + d;
		*(vec4 *)(k + off) = sk[idx];
		*(vec4 *)(v + off) = sv[idx];
	}
}

// kvm_softmax: row (head, i) of the scores s, [heads][rows][cols] floats,
// already scaled, over keys [0, pos[i]]; writes bf16 probabilities, zero
// past pos[i]. Grid: (rows, heads); 256 threads.
extern "C" G void kvm_softmax(const float *s, bf16 *p, const int *pos, int rows, int cols) {
	S float sh[1024];
	const u64 row = (u64)CTAY * rows + CTA;
	const float *r = s + row * cols;
	bf16 *o = p + row * cols;
	const int n = pos[CTA] + 1;
	float m = -3.0e38f;
	for (int j = TID; j < n; j += NTID)
		m = r[j] > m ? r[j] : m;
	m = blockMax(m, sh);
	float sum = 0;
	for (int j = TID; j < n; j += NTID)
		sum += kexp(r[j] - m);
	sum = blockSum(sum, sh);
	for (int j = TID; j < cols; j += NTID)
		o[j] = j < n ? f2bf(__nvvm_div_rn_f(kexp(r[j] - m), sum)) : (bf16)0;
}

// kvm_silu_mul: act[i][j] = bf16(silu(gate) * up), gu[i] = [gate | up].
// Grid: rows.
extern "C" G void kvm_silu_mul(const bf16 *gu, bf16 *act, int inter) {
	const u64 i = CTA;
	for (int j = TID; j < inter; j += NTID) {
		const float g = bf2f(gu[i * 2 * inter + j]), u = bf2f(gu[i * 2 * inter + inter + j]);
		act[i * inter + j] = f2bf(__nvvm_div_rn_f(g, 1.0f + kexp(-g)) * u);
	}
}

// kvm_argmax: the index of the largest of n floats, the first on ties.
// One CTA of 1024 threads.
extern "C" G void kvm_argmax(const float *x, int n, int *out) {
	S float bv[1024];
	S int bi[1024];
	const unsigned t = TID;
	float best = -3.4e38f;
	int bidx = 0x7fffffff;
	for (int j = t; j < n; j += NTID)
		if (x[j] > best) {
			best = x[j];
			bidx = j;
		}
	bv[t] = best;
	bi[t] = bidx;
	SYNC();
	for (unsigned s = NTID / 2; s > 0; s >>= 1) {
		if (t < s && (bv[t + s] > bv[t] || (bv[t + s] == bv[t] && bi[t + s] < bi[t]))) {
			bv[t] = bv[t + s];
			bi[t] = bi[t + s];
		}
		SYNC();
	}
	if (t == 0)
		*out = bi[0];
}

// ---- Fused causal attention on tensor cores (FlashAttention-2 style). ----
//
// A CTA of 4 warps takes 64 computed query rows of one head; each warp
// holds 16 rows' q in mma fragments and their output in fp32 registers.
// Key tiles of 64 positions of K and V (the gathered scratch of the head's
// KV head) go through shared memory, double-buffered with cp.async so that
// the next tile loads while this one is multiplied; S = q·Kᵀ and O += P·V are
// mma.sync.m16n8k16 bf16 products with fp32 accumulation; the softmax is
// online (running row maximum and sum). Row r attends to keys [0, pos[r]];
// tiles past the CTA's last position are skipped, and keys past it are
// zero-filled so that no stale scratch reaches the products.

#define FA_ROWS 64
#define FA_KEYS 64
D static inline float fmaxf(float a, float b) { return a > b ? a : b; }

#define FA_PAD 8 // bf16 of padding per shared row: conflict-free fragment loads

D static inline unsigned smemAddr(const void *p) {
	unsigned a;
	asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
	return a;
}

D static inline void mma16816(float *c, const unsigned *a, unsigned b0, unsigned b1) {
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
	             "{%0,%1,%2,%3};"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

D static inline void ldmatrixT2(unsigned addr, unsigned &b0, unsigned &b1) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(addr));
}

D static inline unsigned pack2(float lo, float hi) { return (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16); }

D static inline float quadMax(float v) {
	v = fmaxf(v, __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, 1, 0x1f));
	return fmaxf(v, __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, 2, 0x1f));
}

D static inline float quadSum(float v) {
	v += __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, 1, 0x1f);
	return v + __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, 2, 0x1f);
}

// The two stages of K and V tiles, in dynamic shared memory:
// 2 × 2 × FA_KEYS × (hd + FA_PAD) bf16 (69,632 bytes at hd 128).
extern "C" S __attribute__((aligned(16))) bf16 kvm_flash_smem[];

// faIssue starts the asynchronous copy of the K and V tile at key k0 into
// a stage; rows past maxKey are zero-filled (cp.async with no source bytes).
template <int HD>
D static inline void faIssue(bf16 *ks, bf16 *vs, const bf16 *kg, const bf16 *vg, int k0, int maxKey) {
	for (int idx = TID; idx < FA_KEYS * HD / 8; idx += NTID) {
		const int r = idx / (HD / 8), c = (idx % (HD / 8)) * 8;
		const int ok = k0 + r <= maxKey;
		const long long off = ok ? (long long)(k0 + r) * HD + c : 0;
		asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smemAddr(ks + r * (HD + FA_PAD) + c)),
		             "l"(kg + off), "r"(ok ? 16 : 0));
		asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smemAddr(vs + r * (HD + FA_PAD) + c)),
		             "l"(vg + off), "r"(ok ? 16 : 0));
	}
	asm volatile("cp.async.commit_group;");
}

template <int HD>
D static void flash(const bf16 *q, const bf16 *kc, const bf16 *vc, bf16 *out, const int *pos, int nc, int qh,
                    int group, long long cap, float scale) {
	const int tile = FA_KEYS * (HD + FA_PAD); // stage t: K at 2t tiles, V at 2t+1
	const int tid = TID, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
	const int h = CTAY, g = h / group;
	// The last row tiles have the most keys: they start first.
	const int row0 = (NCTA - 1 - CTA) * FA_ROWS;
	const int rA = row0 + warp * 16 + gid, rB = rA + 8;
	const int cA = rA < nc ? rA : nc - 1, cB = rB < nc ? rB : nc - 1;
	const int pA = pos[cA], pB = pos[cB];
	const int last = (row0 + FA_ROWS < nc ? row0 + FA_ROWS : nc) - 1;
	const int maxKey = pos[last];
	const float ninf = -__builtin_inff();
	const bf16 *kg = kc + (long long)g * cap * HD, *vg = vc + (long long)g * cap * HD;
	faIssue<HD>(kvm_flash_smem, kvm_flash_smem + tile, kg, vg, 0, maxKey);

	unsigned qa[HD / 16][4];
	const bf16 *qA = q + ((long long)cA * qh + h) * HD, *qB = q + ((long long)cB * qh + h) * HD;
#pragma unroll
	for (int kk = 0; kk < HD / 16; kk++) {
		qa[kk][0] = *(const unsigned *)(qA + kk * 16 + tig * 2);
		qa[kk][1] = *(const unsigned *)(qB + kk * 16 + tig * 2);
		qa[kk][2] = *(const unsigned *)(qA + kk * 16 + 8 + tig * 2);
		qa[kk][3] = *(const unsigned *)(qB + kk * 16 + 8 + tig * 2);
	}
	float o[HD / 8][4];
#pragma unroll
	for (int dt = 0; dt < HD / 8; dt++)
		o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0;
	float mA = ninf, mB = ninf, lA = 0, lB = 0;

	for (int k0 = 0, t = 0; k0 <= maxKey; k0 += FA_KEYS, t ^= 1) {
		if (k0 + FA_KEYS <= maxKey)
			faIssue<HD>(kvm_flash_smem + 2 * (t ^ 1) * tile, kvm_flash_smem + (2 * (t ^ 1) + 1) * tile, kg, vg,
			            k0 + FA_KEYS, maxKey);
		else
			asm volatile("cp.async.commit_group;");
		asm volatile("cp.async.wait_group 1;");
		SYNC();
		bf16(*ks)[HD + FA_PAD] = (bf16(*)[HD + FA_PAD])(kvm_flash_smem + 2 * t * tile);
		bf16(*vs)[HD + FA_PAD] = (bf16(*)[HD + FA_PAD])(kvm_flash_smem + (2 * t + 1) * tile);
		float s[FA_KEYS / 8][4];
#pragma unroll
		for (int nt = 0; nt < FA_KEYS / 8; nt++) {
			s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0;
#pragma unroll
			for (int kk = 0; kk < HD / 16; kk++) {
				const unsigned b0 = *(const unsigned *)&ks[nt * 8 + gid][kk * 16 + tig * 2];
				const unsigned b1 = *(const unsigned *)&ks[nt * 8 + gid][kk * 16 + 8 + tig * 2];
				mma16816(s[nt], qa[kk], b0, b1);
			}
		}
		float tA = ninf, tB = ninf;
#pragma unroll
		for (int nt = 0; nt < FA_KEYS / 8; nt++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const int key = k0 + nt * 8 + tig * 2 + e;
				s[nt][e] = key <= pA ? s[nt][e] * scale : ninf;
				s[nt][2 + e] = key <= pB ? s[nt][2 + e] * scale : ninf;
				tA = fmaxf(tA, s[nt][e]);
				tB = fmaxf(tB, s[nt][2 + e]);
			}
		tA = fmaxf(mA, quadMax(tA));
		tB = fmaxf(mB, quadMax(tB));
		const float corrA = kexp(mA - tA), corrB = kexp(mB - tB);
		mA = tA;
		mB = tB;
		lA *= corrA;
		lB *= corrB;
#pragma unroll
		for (int nt = 0; nt < FA_KEYS / 8; nt++) {
			s[nt][0] = kexp(s[nt][0] - mA);
			s[nt][1] = kexp(s[nt][1] - mA);
			s[nt][2] = kexp(s[nt][2] - mB);
			s[nt][3] = kexp(s[nt][3] - mB);
			lA += s[nt][0] + s[nt][1];
			lB += s[nt][2] + s[nt][3];
		}
#pragma unroll
		for (int dt = 0; dt < HD / 8; dt++) {
			o[dt][0] *= corrA;
			o[dt][1] *= corrA;
			o[dt][2] *= corrB;
			o[dt][3] *= corrB;
		}
#pragma unroll
		for (int kk = 0; kk < FA_KEYS / 16; kk++) {
			unsigned a[4] = {pack2(s[2 * kk][0], s[2 * kk][1]), pack2(s[2 * kk][2], s[2 * kk][3]),
			                 pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
			const unsigned base = smemAddr(&vs[kk * 16 + (lane % 16)][0]);
#pragma unroll
			for (int dt = 0; dt < HD / 8; dt++) {
				unsigned b0, b1;
				ldmatrixT2(base + dt * 16, b0, b1);
				mma16816(o[dt], a, b0, b1);
			}
		}
		SYNC(); // the stage is refilled two tiles on
	}
	lA = quadSum(lA);
	lB = quadSum(lB);
#pragma unroll
	for (int dt = 0; dt < HD / 8; dt++) {
		const int d = dt * 8 + tig * 2;
		if (rA < nc)
			*(unsigned *)(out + ((long long)rA * qh + h) * HD + d) =
			    pack2(__nvvm_div_rn_f(o[dt][0], lA), __nvvm_div_rn_f(o[dt][1], lA));
		if (rB < nc)
			*(unsigned *)(out + ((long long)rB * qh + h) * HD + d) =
			    pack2(__nvvm_div_rn_f(o[dt][2], lB), __nvvm_div_rn_f(o[dt][3], lB));
	}
}

// kvm_flash_d64, kvm_flash_d128: grid (ceil(nc/64), query heads), 128
// threads, 4 × FA_KEYS × (hd + FA_PAD) × 2 bytes of dynamic shared memory. q and out are [nc][qh][hd]; kc, vc [kv heads][cap][hd].
extern "C" G void kvm_flash_d64(const bf16 *q, const bf16 *kc, const bf16 *vc, bf16 *out, const int *pos, int nc,
                                int qh, int group, long long cap, float scale) {
	flash<64>(q, kc, vc, out, pos, nc, qh, group, cap, scale);
}

extern "C" G void kvm_flash_d128(const bf16 *q, const bf16 *kc, const bf16 *vc, bf16 *out, const int *pos, int nc,
                                 int qh, int group, long long cap, float scale) {
	flash<128>(q, kc, vc, out, pos, nc, qh, group, cap, scale);
}
