// model.cu: the model's device kernels (everything but the matrix products,
// which cuBLAS does), compiled to PTX and embedded in the Go package
// (model.ptx, loaded with cuModuleLoadData). No CUDA header is needed: bf16
// values are converted by bit operations, rounding to nearest even as the Go
// reference (model.ToBF16) does, and the few math functions come from NVVM
// builtins. Floating-point contraction is off so that a*b - c*d rounds as in
// Go.
//
//   clang-14 -x cuda --cuda-device-only -nocudainc -nocudalib --cuda-gpu-arch=sm_80 \
//         -O3 -ffp-contract=off -S -o examples/server/internal/gpu/kernels/model.ptx \
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
