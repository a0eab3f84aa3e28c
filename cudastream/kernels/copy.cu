// copy.cu: kvtier's device kernels, compiled to PTX and embedded in the Go
// package (cudastream/kernels/copy.ptx, loaded with cuModuleLoadData).
//
//   kvtier_copy  moves a list of {dst, src, bytes} pieces. The GPU reads or
//                writes pinned host memory directly (registered or
//                cuMemHostAlloc'd memory, at the host's own address under
//                unified addressing), so thousands of small scattered blocks
//                cost one launch instead of one DMA descriptor each.
//   kvtier_fma   a compute kernel (a chain of fused multiply-adds per thread)
//                that stands in for a model's kernel in overlap benchmarks.
//
// Build with either compiler. The committed copy.ptx came from clang 14 (the
// Debian package clang-14, no CUDA toolkit needed), which targets at most
// sm_80; the driver JIT-compiles it for the device (sm_90 on the H200: 40
// registers, no spills). nvcc 13.0 with -arch=compute_90 gives the same
// kernels (32 registers; checked with ptxas, not run through the tests).
//
//   clang-14 -x cuda --cuda-device-only -nocudainc -nocudalib --cuda-gpu-arch=sm_80 \
//         -O3 -S -o cudastream/kernels/copy.ptx cudastream/kernels/copy.cu
//   nvcc -ptx -arch=compute_90 -o cudastream/kernels/copy.ptx cudastream/kernels/copy.cu

#if defined(__clang__) && !defined(__CUDACC_VER_MAJOR__)
// clang without CUDA headers (-nocudainc): spell out what the headers give.
#define KV_GLOBAL __attribute__((global))
#define KV_TID __nvvm_read_ptx_sreg_tid_x()
#define KV_NTID __nvvm_read_ptx_sreg_ntid_x()
#define KV_CTAID __nvvm_read_ptx_sreg_ctaid_x()
#define KV_NCTAID __nvvm_read_ptx_sreg_nctaid_x()
typedef unsigned int kvVec __attribute__((ext_vector_type(4)));
#else
#define KV_GLOBAL __global__
#define KV_TID threadIdx.x
#define KV_NTID blockDim.x
#define KV_CTAID blockIdx.x
#define KV_NCTAID gridDim.x
typedef uint4 kvVec;
#endif

// kvPiece has the layout of cudastream's Copy (and the C drvCopy).
struct kvPiece {
	unsigned long long dst, src;
	long long bytes;
};

// kvUnroll 16-byte loads are in flight per thread before the first store:
// reads of host memory over PCIe take about a microsecond each, so a thread
// must keep several outstanding to fill the link.
#define kvUnroll 4

// kvtier_copy: CTAs take pieces in a grid-stride loop; the threads of a CTA
// share a piece. Pieces whose addresses and size are 16-byte aligned move
// as 16-byte vectors; the rest (and the unaligned remainder) byte by byte.
// The host side splits large copies into pieces of bounded size so that
// every CTA gets a similar share.
extern "C" KV_GLOBAL void kvtier_copy(const kvPiece *pieces, unsigned int n) {
	const unsigned int tid = KV_TID, nt = KV_NTID;
	for (unsigned int i = KV_CTAID; i < n; i += KV_NCTAID) {
		const kvPiece p = pieces[i];
		char *dst = (char *)p.dst;
		const char *src = (const char *)p.src;
		unsigned long long bytes = (unsigned long long)p.bytes;
		unsigned long long done = 0;
		if (((p.dst | p.src) & 15) == 0) {
			kvVec *__restrict__ d = (kvVec *)dst;
			const kvVec *__restrict__ s = (const kvVec *)src;
			unsigned long long nv = bytes >> 4;
			unsigned long long k = tid;
			const unsigned long long step = (unsigned long long)nt * kvUnroll;
			for (; k + (kvUnroll - 1) * nt < nv; k += step) {
				kvVec v[kvUnroll];
#pragma unroll
				for (int u = 0; u < kvUnroll; u++)
					v[u] = s[k + u * nt];
#pragma unroll
				for (int u = 0; u < kvUnroll; u++)
					d[k + u * nt] = v[u];
			}
			for (; k < nv; k += nt)
				d[k] = s[k];
			done = nv << 4;
		}
		for (unsigned long long k = done + tid; k < bytes; k += nt)
			dst[k] = src[k];
	}
}

// kvtier_fma: each thread runs iters rounds of four independent FMA chains
// and writes one float, so the compiler cannot drop the work.
extern "C" KV_GLOBAL void kvtier_fma(float *out, unsigned int iters) {
	const unsigned int id = KV_CTAID * KV_NTID + KV_TID;
	float a = 1.0f + (float)id * 1e-7f, b = 0.5f, c = 0.25f, d = 0.125f;
	const float m = 0.999999f, k = 1e-6f;
	for (unsigned int i = 0; i < iters; i++) {
		a = a * m + k;
		b = b * m + k;
		c = c * m + k;
		d = d * m + k;
	}
	out[id] = a + b + c + d;
}
