// sum.cu: kvtier_wordsum, the word sums of KV blocks in device memory,
// compiled to PTX and embedded in the Go package (cudastream/kernels/sum.ptx,
// loaded with cuModuleLoadData beside copy.ptx).
//
// The sum is internal/checksum's word sum: a block's bytes, in host order
// (piece 0, then piece 1, ...), read as little-endian 64-bit words, each
// mixed with its index by MurmurHash3's fmix64 and the mixes added modulo
// 2^64. Addition commutes, so every CTA adds up one chunk of one piece of
// one block and writes that partial sum; the host adds the partials and
// finishes the sum with the length (checksum.WordSumFinish). The constants
// MUST stay those of internal/checksum/wordsum.go.
//
//   nvcc -ptx -arch=compute_90 -o cudastream/kernels/sum.ptx cudastream/kernels/sum.cu
//
// The committed sum.ptx came from nvcc 13.0 (PTX ISA 9.0: a driver of CUDA
// 13.0 or later JITs it; ptxas for sm_90: 25 registers, no spills). An
// older driver cannot load it, and WordSums then fails with ErrNotSupported.

#define KV_INDEX_MUL 0x9e3779b97f4a7c15ULL
#define KV_INDEX_ADD 0x6a09e667f3bcc908ULL
#define KV_SUM_MAX_BLOCKS 256

// kvSumBlocks carries one launch's block numbers in the kernel's
// parameters, so that a launch needs no descriptor copy.
struct kvSumBlocks {
	int ids[KV_SUM_MAX_BLOCKS];
};

static __device__ __forceinline__ unsigned long long kvFmix(unsigned long long x) {
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return x;
}

// kvtier_wordsum: CTA (c, p, z) adds the mixes of chunk c (chunkWords
// words) of piece p of block ids[z], whose piece p starts at
// bases[p] + ids[z]*blockStride and holds pieceWords words, the piece's
// first word having index p*pieceWords in its block. It writes the partial
// sum to partials[(z*pieces + p)*gridDim.x + c].
extern "C" __global__ void kvtier_wordsum(const unsigned long long *__restrict__ bases, unsigned int pieces,
                                          unsigned long long pieceWords, unsigned long long blockStride,
                                          const kvSumBlocks blocks, unsigned long long chunkWords,
                                          unsigned long long *__restrict__ partials) {
	const unsigned int c = blockIdx.x, p = blockIdx.y, z = blockIdx.z;
	const unsigned long long w0 = (unsigned long long)c * chunkWords;
	const unsigned long long n = pieceWords - w0 < chunkWords ? pieceWords - w0 : chunkWords;
	const unsigned long long *__restrict__ src =
	    (const unsigned long long *)(bases[p] + (unsigned long long)blocks.ids[z] * blockStride) + w0;
	const unsigned long long first = (unsigned long long)p * pieceWords + w0;
	unsigned long long acc = 0;
#pragma unroll 4
	for (unsigned long long k = threadIdx.x; k < n; k += blockDim.x)
		acc += kvFmix(src[k] ^ ((first + k) * KV_INDEX_MUL + KV_INDEX_ADD));
	__shared__ unsigned long long warps[32];
	for (int o = 16; o > 0; o >>= 1)
		acc += __shfl_down_sync(0xffffffffu, acc, o);
	if ((threadIdx.x & 31) == 0)
		warps[threadIdx.x >> 5] = acc;
	__syncthreads();
	if (threadIdx.x < 32) {
		acc = threadIdx.x < (blockDim.x >> 5) ? warps[threadIdx.x] : 0;
		for (int o = 16; o > 0; o >>= 1)
			acc += __shfl_down_sync(0xffffffffu, acc, o);
		if (threadIdx.x == 0)
			partials[((unsigned long long)z * pieces + p) * gridDim.x + c] = acc;
	}
}
