// attn_check.cu: checks and times kvm_flash_h128 (kernels/hopper.ptx)
// against kvm_flash_d128 (kernels/model.ptx) on the same gathered KV, and
// both against an fp64 CPU reference on sampled rows. It loads both PTX
// files through the driver API, as the Go package does. Built and run on
// the GPU machine (the CUDA toolkit is there, not on the build machine):
//
//   nvcc -O3 -o attn_check benchmarks/prefill/attn_check.cu -lcuda
//   ./attn_check examples/server/internal/gpu/kernels/model.ptx hopper.ptx [out.json]
//
// llama-3.1-8b's attention shapes: 32 query heads, 8 KV heads of 128, KV
// in blocks of 16 tokens laid out as the server's region. Each case prints
// the largest differences and, for the timed cases, the median of 5 runs
// of each kernel (alternating, after a warm-up) and the achieved TFLOP/s
// counting 4·128 FLOP per (query head, row, key ≤ its position); out.json
// gets every run's milliseconds (benchmarks/prefill/attention_results.py
// writes them as benchmarks/results/attention-MACHINE.{md,json}).

#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#define CK(x)                                                                                                        \
	do {                                                                                                         \
		CUresult r_ = (x);                                                                                   \
		if (r_ != CUDA_SUCCESS) {                                                                            \
			const char *n_ = "?";                                                                        \
			cuGetErrorName(r_, &n_);                                                                     \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, n_);                              \
			exit(1);                                                                                     \
		}                                                                                                    \
	} while (0)

static std::string readFile(const char *p) {
	FILE *f = fopen(p, "rb");
	if (!f) {
		perror(p);
		exit(1);
	}
	std::string s;
	char buf[65536];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		s.append(buf, n);
	fclose(f);
	return s;
}

static float bf2f(uint16_t h) {
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t f2bf(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static CUmodule loadModule(const char *path) {
	std::string s = readFile(path);
	CUmodule m;
	char log[8192] = "";
	CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void *vals[] = {log, (void *)(uintptr_t)sizeof log};
	CUresult r = cuModuleLoadDataEx(&m, s.c_str(), 2, opts, vals);
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, "load %s: %d\n%s\n", path, (int)r, log);
		exit(1);
	}
	return m;
}

const int QH = 32, KVH = 8, HDIM = 128, BT = 16;

struct Case {
	int nc, cached;
	bool time;
};

int main(int argc, char **argv) {
	if (argc < 3) {
		fprintf(stderr, "usage: attn_check model.ptx hopper.ptx [out.json]\n");
		return 2;
	}
	CK(cuInit(0));
	CUdevice dev;
	CK(cuDeviceGet(&dev, 0));
	CUcontext ctx;
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	CUmodule mm = loadModule(argv[1]), hm = loadModule(argv[2]);
	CUfunction gather, flash, gatherT, flashH;
	CK(cuModuleGetFunction(&gather, mm, "kvm_gather"));
	CK(cuModuleGetFunction(&flash, mm, "kvm_flash_d128"));
	CK(cuModuleGetFunction(&gatherT, hm, "kvm_gather_t"));
	CK(cuModuleGetFunction(&flashH, hm, "kvm_flash_h128"));
	const int smemD = 2 * 2 * 64 * (HDIM + 8) * 2, smemH = 5 * 32768 + 1024;
	CK(cuFuncSetAttribute(flash, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smemD));
	CK(cuFuncSetAttribute(flashH, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smemH));
	FILE *js = argc > 3 ? fopen(argv[3], "w") : nullptr;
	if (js)
		fprintf(js, "[\n");

	const Case cases[] = {{300, 0, false},    {1000, 200, false}, {2048, 0, true},
	                      {512, 8192, true},  {8192, 0, true},    {32768, 0, true}};
	std::mt19937_64 rng(7);
	int bad = 0;
	bool firstJS = true;
	for (const Case &cs : cases) {
		const int nc = cs.nc, n = cs.cached + nc, blocks = (n + BT - 1) / BT;
		const long long cap = ((long long)n + 63) / 64 * 64 + 64;
		const long long partBytes = (long long)BT * KVH * HDIM * 2, blockBytes = 2 * partBytes; // one layer
		std::vector<int> slots(blocks), pos(nc);
		for (int i = 0; i < blocks; i++)
			slots[i] = i;
		std::shuffle(slots.begin(), slots.end(), rng);
		for (int i = 0; i < nc; i++)
			pos[i] = cs.cached + i;
		std::uniform_real_distribution<float> U(-2.f, 2.f);
		std::vector<uint16_t> region((size_t)blocks * blockBytes / 2), qh((size_t)nc * QH * HDIM);
		for (auto &x : region)
			x = f2bf(U(rng));
		for (auto &x : qh)
			x = f2bf(U(rng));
		CUdeviceptr dRegion, dSlots, dPos, dQ, dK, dV, dK2, dVt, dO1, dO2;
		const size_t kvBytes = (size_t)KVH * cap * HDIM * 2, oBytes = (size_t)nc * QH * HDIM * 2;
		CK(cuMemAlloc(&dRegion, region.size() * 2));
		CK(cuMemAlloc(&dSlots, blocks * 4));
		CK(cuMemAlloc(&dPos, nc * 4));
		CK(cuMemAlloc(&dQ, qh.size() * 2));
		for (CUdeviceptr *p : {&dK, &dV, &dK2, &dVt})
			CK(cuMemAlloc(p, kvBytes));
		CK(cuMemAlloc(&dO1, oBytes));
		CK(cuMemAlloc(&dO2, oBytes));
		// Stale, non-finite scratch: neither kernel may read past its keys.
		CK(cuMemsetD8(dK, 0xff, kvBytes));
		CK(cuMemsetD8(dV, 0xff, kvBytes));
		CK(cuMemsetD8(dK2, 0xff, kvBytes));
		CK(cuMemsetD8(dVt, 0xff, kvBytes));
		CK(cuMemcpyHtoD(dRegion, region.data(), region.size() * 2));
		CK(cuMemcpyHtoD(dSlots, slots.data(), blocks * 4));
		CK(cuMemcpyHtoD(dPos, pos.data(), nc * 4));
		CK(cuMemcpyHtoD(dQ, qh.data(), qh.size() * 2));

		int kvh = KVH, hd = HDIM, bt = BT, layer = 0, ncv = nc, qhv = QH, group = QH / KVH, nv = n;
		long long bb = blockBytes, pb = partBytes, capv = cap;
		float scale = 1.0f / sqrtf((float)HDIM);
		{
			void *a[] = {&dRegion, &dSlots, &dK, &dV, &kvh, &hd, &bt, &bb, &pb, &layer, &capv};
			CK(cuLaunchKernel(gather, n, 1, 1, 128, 1, 1, 0, 0, a, 0));
			void *b[] = {&dRegion, &dSlots, &dK2, &dVt, &kvh, &bt, &bb, &pb, &layer, &capv, &nv};
			CK(cuLaunchKernel(gatherT, (n + 63) / 64, KVH, 1, 256, 1, 1, 0, 0, b, 0));
		}
		void *fa[] = {&dQ, &dK, &dV, &dO1, &dPos, &ncv, &qhv, &group, &capv, &scale};
		void *fh[] = {&dQ, &dK2, &dVt, &dO2, &dPos, &ncv, &qhv, &group, &capv, &scale};
		auto runD = [&] { CK(cuLaunchKernel(flash, (nc + 63) / 64, QH, 1, 128, 1, 1, smemD, 0, fa, 0)); };
		auto runH = [&] { CK(cuLaunchKernel(flashH, QH, (nc + 127) / 128, 1, 256, 1, 1, smemH, 0, fh, 0)); };
		runD();
		runH();
		CK(cuCtxSynchronize());

		// The gathers agree: K the same, V transposed.
		std::vector<uint16_t> k1(kvBytes / 2), k2(kvBytes / 2), v1(kvBytes / 2), vt(kvBytes / 2);
		CK(cuMemcpyDtoH(k1.data(), dK, kvBytes));
		CK(cuMemcpyDtoH(k2.data(), dK2, kvBytes));
		CK(cuMemcpyDtoH(v1.data(), dV, kvBytes));
		CK(cuMemcpyDtoH(vt.data(), dVt, kvBytes));
		long long gatherBad = 0;
		for (int g = 0; g < KVH; g++)
			for (int t = 0; t < n; t++)
				for (int d = 0; d < HDIM; d++) {
					const size_t kv = ((size_t)g * cap + t) * HDIM + d, tv = ((size_t)g * HDIM + d) * cap + t;
					gatherBad += k1[kv] != k2[kv];
					gatherBad += v1[kv] != vt[tv];
				}

		std::vector<uint16_t> o1(oBytes / 2), o2(oBytes / 2);
		CK(cuMemcpyDtoH(o1.data(), dO1, oBytes));
		CK(cuMemcpyDtoH(o2.data(), dO2, oBytes));
		double maxDiff = 0, maxRef1 = 0, maxRef2 = 0;
		long long nonFinite = 0;
		for (size_t i = 0; i < o1.size(); i++) {
			const float a = bf2f(o1[i]), b = bf2f(o2[i]);
			if (!std::isfinite(a) || !std::isfinite(b)) {
				nonFinite++;
				continue;
			}
			maxDiff = std::max(maxDiff, (double)fabsf(a - b));
		}
		// fp64 reference on sampled (row, head) pairs, from the region.
		auto kAt = [&](int g, int t, int d, int part) {
			const size_t byteOff = (size_t)slots[t / BT] * blockBytes + part * partBytes +
			                       (((size_t)(t % BT) * KVH + g) * HDIM + d) * 2;
			return (double)bf2f(region[byteOff / 2]);
		};
		const int sampleRows[] = {0, 1, nc / 3, nc / 2, nc - 2, nc - 1};
		for (int r : sampleRows)
			for (int h : {0, 5, 31}) {
				const int g = h / group, p = pos[r];
				std::vector<double> sc(p + 1);
				double m = -1e300;
				for (int t = 0; t <= p; t++) {
					double dot = 0;
					for (int d = 0; d < HDIM; d++)
						dot += bf2f(qh[((size_t)r * QH + h) * HDIM + d]) * kAt(g, t, d, 0);
					sc[t] = dot * scale;
					m = std::max(m, sc[t]);
				}
				double sum = 0;
				for (auto &x : sc)
					sum += (x = exp(x - m));
				for (int d = 0; d < HDIM; d++) {
					double acc = 0;
					for (int t = 0; t <= p; t++)
						acc += sc[t] * kAt(g, t, d, 1);
					acc /= sum;
					const size_t i = ((size_t)r * QH + h) * HDIM + d;
					maxRef1 = std::max(maxRef1, fabs(acc - bf2f(o1[i])));
					maxRef2 = std::max(maxRef2, fabs(acc - bf2f(o2[i])));
				}
			}
		const bool ok = gatherBad == 0 && nonFinite == 0 && maxRef2 <= 2 * maxRef1 + 1e-2;
		bad += !ok;
		printf("nc %5d after %5d: gather mismatches %lld, non-finite %lld, max |h-d| %.4g, max err vs fp64: mma %.4g, "
		       "wgmma %.4g %s\n",
		       nc, cs.cached, gatherBad, nonFinite, maxDiff, maxRef1, maxRef2, ok ? "ok" : "FAIL");

		if (cs.time) {
			double flops = 0;
			for (int r = 0; r < nc; r++)
				flops += 4.0 * HDIM * QH * (pos[r] + 1);
			CUevent e0, e1;
			CK(cuEventCreate(&e0, 0));
			CK(cuEventCreate(&e1, 0));
			std::vector<float> tD, tH;
			for (int it = 0; it < 10; it++) {
				const bool h = (it % 2) == (it / 2 % 2);
				CK(cuEventRecord(e0, 0));
				h ? runH() : runD();
				CK(cuEventRecord(e1, 0));
				CK(cuEventSynchronize(e1));
				float ms;
				CK(cuEventElapsedTime(&ms, e0, e1));
				(h ? tH : tD).push_back(ms);
			}
			auto med = [](std::vector<float> v) {
				std::sort(v.begin(), v.end());
				return v[v.size() / 2];
			};
			const float mD = med(tD), mH = med(tH);
			printf("   time: mma %.3f ms (%.0f TFLOP/s), wgmma %.3f ms (%.0f TFLOP/s) [min %.3f max %.3f]\n", mD,
			       flops / mD / 1e9, mH, flops / mH / 1e9, *std::min_element(tH.begin(), tH.end()),
			       *std::max_element(tH.begin(), tH.end()));
			if (js) {
				auto list = [&](const std::vector<float> &v) {
					for (size_t i = 0; i < v.size(); i++)
						fprintf(js, "%s%.5g", i ? ", " : "", v[i]);
				};
				fprintf(js, "%s  {\"rows\": %d, \"cached\": %d, \"flops\": %.6g, \"mma_ms\": [", firstJS ? "" : ",\n", nc,
				        cs.cached, flops);
				list(tD);
				fprintf(js, "], \"wgmma_ms\": [");
				list(tH);
				fprintf(js, "]}");
				firstJS = false;
			}
			cuEventDestroy(e0);
			cuEventDestroy(e1);
		}
		for (CUdeviceptr p : {dRegion, dSlots, dPos, dQ, dK, dV, dK2, dVt, dO1, dO2})
			cuMemFree(p);
	}
	if (js) {
		fprintf(js, "\n]\n");
		fclose(js);
	}
	printf(bad ? "FAIL: %d cases\n" : "all cases ok\n", bad);
	return bad ? 1 : 0;
}
