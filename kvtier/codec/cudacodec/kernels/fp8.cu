// fp8.cu: package codec's FP8E4M3PerHead on the GPU, compiled to PTX and
// embedded in package cudacodec (kernels/fp8.ptx, loaded with
// cuModuleLoadData through cudastream.ModuleLoader).
//
//   kvtier_fp8_quantize          bf16 blocks -> encoded blocks
//   kvtier_fp8_dequantize        encoded blocks -> bf16 blocks
//   kvtier_fp8_quantize_blocks   bf16 blocks where a KV layout keeps them -> encoded blocks
//   kvtier_fp8_dequantize_blocks encoded blocks -> bf16 blocks where a KV layout keeps them
//
// The bytes MUST be those of kvtier/codec's Go reference, bit for bit (the
// GPU tests compare them): scale = amax/448 and inv = 448/amax rounded to
// nearest (IEEE division), a value's code is cvt.rn.satfinite of x*inv,
// ±Inf saturates, NaN gives 0x7F, groups with amax below 2^-100 get scale 0;
// decoding multiplies a code's exact value by its scale and rounds to bf16
// to nearest even by hand, NaN codes giving 0x7FC0. No fast math: the
// products and quotients are IEEE, subnormals kept.
//
// One CTA per (layer, part) of one block: grid (layers*parts, blocks).
// Encoded block b is always at enc + b*encStride. The first two kernels
// take bf16 block b whole at raw + b*rawStride, in (layer, part) order.
// The _blocks kernels read or write each part where the KV cache keeps
// it: part lp of the launch's block b at table[lp] + id(b)*blockStride,
// table being layers*parts addresses in device memory and id(b) the b-th
// of the launch's 16 GPU block numbers, two 32-bit ones to a parameter
// (ids0 holds blocks 0 and 1, block 0 in its low half). So no copy
// gathers or scatters the blocks around the coding. Their grid's x runs
// over the launch's parts, from lpBase: a launch may code some layers of
// its blocks (an onboard dequantizes a group of layers at a time, so that
// the first layers are ready before the last have crossed the link); the
// shape comes packed in one parameter (KV_TOKENS and the rest). A unit of work is 16 values of one head (HeadDim is a
// multiple of 16): two 16-byte loads of bf16, one 16-byte store of codes.
// The quantizer reads its part twice, once for the heads' amax and once to
// convert; the second read comes from L2.
//
// Every parameter is 8 bytes (cudastream.Launcher's rule).
//
//   nvcc -ptx -arch=sm_90 -o kvtier/codec/cudacodec/kernels/fp8.ptx kvtier/codec/cudacodec/kernels/fp8.cu
//
// cvt.rn.satfinite.e4m3x2.f32 needs sm_89 or later.

#define KV_MAX_HEADS 1024

// The _blocks kernels' shape parameter: tokens in bits 0-19, heads in
// 20-31, head dim in 32-47, the block's (layer, part) count in 48-63.
#define KV_TOKENS(s) ((s) & 0xFFFFFull)
#define KV_HEADS(s) (((s) >> 20) & 0xFFFull)
#define KV_HEADDIM(s) (((s) >> 32) & 0xFFFFull)
#define KV_LPS(s) ((unsigned)((s) >> 48))
#define KV_MIN_AMAX 0x1p-100f

typedef unsigned long long u64;

// kvAbsMax16 is the largest finite |x| of 16 bf16 values as its bf16
// magnitude bits (non-negative floats order as integers): 0 if none.
static __device__ __forceinline__ unsigned kvAbsMax16(uint4 a, uint4 b) {
	unsigned w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
	unsigned m = 0;
#pragma unroll
	for (int i = 0; i < 8; i++) {
		unsigned lo = w[i] & 0x7FFFu, hi = (w[i] >> 16) & 0x7FFFu;
		if (lo < 0x7F80u && lo > m)
			m = lo;
		if (hi < 0x7F80u && hi > m)
			m = hi;
	}
	return m;
}

// kvScaled is x*inv for the bf16 bits h, with ±Inf kept and any NaN made
// the positive quiet NaN (which converts to 0x7F).
static __device__ __forceinline__ float kvScaled(unsigned h, float inv) {
	float x = __uint_as_float(h << 16);
	float v = __fmul_rn(x, inv);
	if (isinf(x))
		v = x;
	if (isnan(v))
		v = __uint_as_float(0x7FC00000u);
	return v;
}

// kvCodes4 converts the 4 bf16 values of two words into 4 codes, the
// first value in the lowest byte.
static __device__ __forceinline__ unsigned kvCodes4(unsigned w0, unsigned w1, float inv) {
	unsigned short c01, c23;
	float v0 = kvScaled(w0 & 0xFFFFu, inv), v1 = kvScaled(w0 >> 16, inv);
	float v2 = kvScaled(w1 & 0xFFFFu, inv), v3 = kvScaled(w1 >> 16, inv);
	// cvt puts its first source in the upper byte.
	asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(c01) : "f"(v1), "f"(v0));
	asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(c23) : "f"(v3), "f"(v2));
	return (unsigned)c01 | ((unsigned)c23 << 16);
}

// kvQuantizePart encodes part lp of one block: in is the part's bf16
// values, out the block's encoded bytes (its scales, then its codes).
static __device__ __forceinline__ void kvQuantizePart(const uint4 *in, unsigned char *out, unsigned lp, unsigned lps,
                                                      u64 tokens, u64 heads, u64 headDim, u64 scaleBytes) {
	__shared__ unsigned amax[KV_MAX_HEADS];
	__shared__ float inv[KV_MAX_HEADS];
	const unsigned tid = threadIdx.x, nt = blockDim.x;
	const u64 n = tokens * heads * headDim; // values in one (layer, part)
	const u64 units = n / 16, unitsPerHead = headDim / 16;
	uint4 *codes = (uint4 *)(out + scaleBytes + (u64)lp * n);
	float *scales = (float *)out + (u64)lp * heads;

	for (unsigned h = tid; h < heads; h += nt)
		amax[h] = 0;
	if (lp == 0) // the scale section's padding
		for (u64 i = (u64)lps * heads * 4 + tid; i < scaleBytes; i += nt)
			out[i] = 0;
	__syncthreads();
#pragma unroll 4
	for (u64 u = tid; u < units; u += nt) {
		unsigned m = kvAbsMax16(in[2 * u], in[2 * u + 1]);
		if (m != 0)
			atomicMax(&amax[(u / unitsPerHead) % heads], m);
	}
	__syncthreads();
	for (unsigned h = tid; h < heads; h += nt) {
		float a = __uint_as_float(amax[h] << 16), s = 0.f, f = 0.f;
		if (a >= KV_MIN_AMAX) {
			s = __fdiv_rn(a, 448.f);
			f = __fdiv_rn(448.f, a);
		}
		scales[h] = s;
		inv[h] = f;
	}
	__syncthreads();
#pragma unroll 4
	for (u64 u = tid; u < units; u += nt) {
		const float f = inv[(u / unitsPerHead) % heads];
		const uint4 a = in[2 * u], b = in[2 * u + 1];
		codes[u] = make_uint4(kvCodes4(a.x, a.y, f), kvCodes4(a.z, a.w, f), kvCodes4(b.x, b.y, f),
		                      kvCodes4(b.z, b.w, f));
	}
}

// kvPart is part lp of the launch's block b where the KV layout keeps it
// (the _blocks kernels' addressing, in this file's header).
static __device__ __forceinline__ u64 kvPart(u64 table, u64 blockStride, unsigned lp, unsigned b, u64 ids0, u64 ids1,
                                             u64 ids2, u64 ids3, u64 ids4, u64 ids5, u64 ids6, u64 ids7) {
	const u64 ids[8] = {ids0, ids1, ids2, ids3, ids4, ids5, ids6, ids7};
	const u64 id = (ids[b >> 1] >> (32 * (b & 1))) & 0xFFFFFFFFull;
	return ((const u64 *)table)[lp] + id * blockStride;
}

extern "C" __global__ void __launch_bounds__(256)
    kvtier_fp8_quantize(u64 src, u64 dst, u64 srcStride, u64 dstStride, u64 tokens, u64 heads, u64 headDim,
                        u64 scaleBytes) {
	const unsigned lp = blockIdx.x;
	const u64 n = tokens * heads * headDim;
	kvQuantizePart((const uint4 *)(src + blockIdx.y * srcStride + (u64)lp * n * 2),
	               (unsigned char *)(dst + blockIdx.y * dstStride), lp, gridDim.x, tokens, heads, headDim, scaleBytes);
}

extern "C" __global__ void __launch_bounds__(256)
    kvtier_fp8_quantize_blocks(u64 enc, u64 encStride, u64 table, u64 blockStride, u64 shape, u64 scaleBytes,
                               u64 lpBase, u64 unused, u64 ids0, u64 ids1, u64 ids2, u64 ids3, u64 ids4, u64 ids5,
                               u64 ids6, u64 ids7) {
	const unsigned lp = (unsigned)lpBase + blockIdx.x;
	const u64 part = kvPart(table, blockStride, lp, blockIdx.y, ids0, ids1, ids2, ids3, ids4, ids5, ids6, ids7);
	kvQuantizePart((const uint4 *)part, (unsigned char *)(enc + blockIdx.y * encStride), lp, KV_LPS(shape),
	               KV_TOKENS(shape), KV_HEADS(shape), KV_HEADDIM(shape), scaleBytes);
}

// kvBF16 is code c's value times scale, rounded to bf16 to nearest even;
// NaN codes give 0x7FC0.
static __device__ __forceinline__ unsigned kvBF16(unsigned c, float scale) {
	const unsigned e = (c >> 3) & 15u, m = c & 7u;
	if ((c & 0x7Fu) == 0x7Fu)
		return 0x7FC0u;
	float v = e == 0 ? __fmul_rn((float)m, 0x1p-9f) : __uint_as_float(((e + 120u) << 23) | (m << 20));
	if (c & 0x80u)
		v = -v;
	const unsigned b = __float_as_uint(__fmul_rn(v, scale));
	return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}

// kvPair decodes bytes k and k+1 of w into one word of two bf16.
static __device__ __forceinline__ unsigned kvPair(unsigned w, int k, float scale) {
	return kvBF16((w >> (8 * k)) & 0xFFu, scale) | (kvBF16((w >> (8 * k + 8)) & 0xFFu, scale) << 16);
}

// kvDequantizePart decodes part lp of one block: in is the block's
// encoded bytes, out the part's bf16 values.
static __device__ __forceinline__ void kvDequantizePart(const unsigned char *in, uint4 *out, unsigned lp, u64 tokens,
                                                        u64 heads, u64 headDim, u64 scaleBytes) {
	__shared__ float scale[KV_MAX_HEADS];
	const unsigned tid = threadIdx.x, nt = blockDim.x;
	const u64 n = tokens * heads * headDim;
	const u64 units = n / 16, unitsPerHead = headDim / 16;
	const uint4 *codes = (const uint4 *)(in + scaleBytes + (u64)lp * n);
	for (unsigned h = tid; h < heads; h += nt)
		scale[h] = ((const float *)in)[(u64)lp * heads + h];
	__syncthreads();
#pragma unroll 4
	for (u64 u = tid; u < units; u += nt) {
		const float s = scale[(u / unitsPerHead) % heads];
		const uint4 c = codes[u];
		out[2 * u] = make_uint4(kvPair(c.x, 0, s), kvPair(c.x, 2, s), kvPair(c.y, 0, s), kvPair(c.y, 2, s));
		out[2 * u + 1] = make_uint4(kvPair(c.z, 0, s), kvPair(c.z, 2, s), kvPair(c.w, 0, s), kvPair(c.w, 2, s));
	}
}

extern "C" __global__ void __launch_bounds__(256)
    kvtier_fp8_dequantize(u64 src, u64 dst, u64 srcStride, u64 dstStride, u64 tokens, u64 heads, u64 headDim,
                          u64 scaleBytes) {
	const unsigned lp = blockIdx.x;
	const u64 n = tokens * heads * headDim;
	kvDequantizePart((const unsigned char *)(src + blockIdx.y * srcStride),
	                 (uint4 *)(dst + blockIdx.y * dstStride + (u64)lp * n * 2), lp, tokens, heads, headDim, scaleBytes);
}

extern "C" __global__ void __launch_bounds__(256)
    kvtier_fp8_dequantize_blocks(u64 enc, u64 encStride, u64 table, u64 blockStride, u64 shape, u64 scaleBytes,
                                 u64 lpBase, u64 unused, u64 ids0, u64 ids1, u64 ids2, u64 ids3, u64 ids4, u64 ids5,
                                 u64 ids6, u64 ids7) {
	const unsigned lp = (unsigned)lpBase + blockIdx.x;
	const u64 part = kvPart(table, blockStride, lp, blockIdx.y, ids0, ids1, ids2, ids3, ids4, ids5, ids6, ids7);
	kvDequantizePart((const unsigned char *)(enc + blockIdx.y * encStride), (uint4 *)part, lp, KV_TOKENS(shape),
	                 KV_HEADS(shape), KV_HEADDIM(shape), scaleBytes);
}
