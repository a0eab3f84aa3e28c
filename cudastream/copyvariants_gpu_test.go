//go:build cgo

package cudastream_test

import (
	"bytes"
	"cmp"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kvtier.dev/internal/bytesize"
	"kvtier.dev/internal/results"

	// The GPU tests are outside the package: export_test.go says why.
	. "kvtier.dev/cudastream"
)

// TestCuCopyVariants records the measurements behind the copy kernel's
// defaults (KernelCopyOptions), the batch call size (DRV_BATCH_CHUNK) and
// MethodAuto's switches: 1 GiB of blocks scattered on the GPU, contiguous
// in a pinned pool, moved by one large copy (the baseline), by
// cuMemcpyBatchAsync in calls of 4096 and 256 descriptors, and by the copy
// kernel in several shapes: the embedded one and each variant built from
// kernels/variants.cu into $KVTIER_PTX_DIR. Then how much a 16 KiB onboard
// by each slows a one-wave compute kernel (kvtier_fma), with the copy's
// CTAs placed before the compute kernel's and after them. Each case: one
// warm-up round, then 5 with the order rotated. It needs nvcc on the GPU
// machine for the variants:
//
//	cd cudastream/kernels && nvcc -ptx -arch=sm_90 -DKV_VARIANT=1 -DKV_S=3 -DKV_C=12288 -o /tmp/ptx/bulk-s3-c12k.ptx variants.cu
//	cd cudastream && KVTIER_PTX_DIR=/tmp/ptx KVTIER_RESULTS=DIR ./cudastream.test -test.run CopyVariants -test.v
//
// KVTIER_RESULTS names the directory for copykernel-<machine>.{json,md}
// (machine: $KVTIER_MACHINE, default h200; commit: $KVTIER_COMMIT).
func TestCuCopyVariants(t *testing.T) {
	dir := os.Getenv("KVTIER_PTX_DIR")
	if dir == "" {
		t.Skip("set KVTIER_PTX_DIR to measure (see the comment)")
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.ptx"))
	cuMust(t, "Glob", err)
	slices.Sort(files)
	machine := cmp.Or(os.Getenv("KVTIER_MACHINE"), "h200")
	res := results.New("copykernel", machine, os.Getenv("KVTIER_COMMIT"))
	res.Command = "KVTIER_PTX_DIR=" + dir + " " + res.Command
	res.Notes = append(res.Notes,
		"1 GiB per case: blocks scattered at random over a 4 GiB device region, contiguous in a 1 GiB cuMemHostAlloc pool; GiB/s = bytes / wall time from submission to stream synchronize",
		"each case: one warm-up round, then 5 rounds with the order of the methods rotated",
		"kernel rows: <variant> <CTAs>x<threads per CTA>; embedded = cudastream/kernels/copy.ptx (clang 14, sm_80 PTX JIT-compiled); bulk-* = kernels/variants.cu KV_VARIANT=1 (nvcc 13.0, sm_90), stages x bytes of shared memory per CTA",
		"overlap rows: kvtier_fma in one wave (4 CTAs of 256 threads per SM, 2^19 iterations) timed by events on its own stream, alone and while a 1 GiB onboard of 16 KiB blocks runs; copy placed first: CopyKernel then the launch; compute placed first: the launch then CopyKernel (each variant's module has its own build of kvtier_fma, so each has its own 'alone' row)")
	orig := *CopyPTX
	defer func() { *CopyPTX = orig }()
	type variant struct{ name, ptx string }
	vs := []variant{{"embedded", orig}}
	for _, f := range files {
		b, err := os.ReadFile(f)
		cuMust(t, "ReadFile", err)
		vs = append(vs, variant{strings.TrimSuffix(filepath.Base(f), ".ptx"), string(b)})
	}
	for i, v := range vs {
		*CopyPTX = v.ptx
		cuCopyVariant(t, res, v.name, i == 0)
	}
	var md strings.Builder
	cuMust(t, "Markdown", res.Markdown(&md))
	t.Log("\n" + md.String())
	if out := os.Getenv("KVTIER_RESULTS"); out != "" {
		cuMust(t, "Write", res.Write(out))
	}
}

// cuCopyVariant measures the copy kernel currently in CopyPTX under name;
// with baselines, also one large copy and batched copies.
func cuCopyVariant(t *testing.T, res *results.File, name string, baselines bool) {
	const total = 1 << 30
	d, err := Open(0)
	cuMust(t, "Open", err)
	defer d.Close()
	host, err := d.HostAlloc(2 * total)
	cuMust(t, "HostAlloc", err)
	defer d.HostFree(host)
	dev, err := d.Alloc(4 * total)
	cuMust(t, "Alloc", err)
	defer d.Free(dev)
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	kc := cuKernelCopier(t, s)
	defer SetBatchChunk(d, 0)

	// Data first: random pieces host -> GPU -> another host range, with
	// unaligned sizes among them.
	r := rand.New(rand.NewPCG(7, 7))
	src, dst := host[:64<<20], host[total:total+64<<20]
	cuRandom(r, src)
	clear(dst)
	var up, down []Copy
	end := 0
	for end < len(src)-(300<<10) {
		n := (r.IntN(256<<10) + 1) &^ 15
		if r.IntN(8) == 0 {
			n = r.IntN(300<<10) + 1
		}
		up = append(up, Copy{Dst: uint64(dev) + uint64(end), Src: HostAddr(src[end:]), Bytes: int64(n)})
		down = append(down, Copy{Dst: HostAddr(dst[end:]), Src: uint64(dev) + uint64(end), Bytes: int64(n)})
		end += n
	}
	cuMust(t, name+" CopyKernel up", kc.CopyKernel(HostToDevice, up))
	cuMust(t, name+" CopyKernel down", kc.CopyKernel(DeviceToHost, down))
	cuMust(t, "Synchronize", s.Synchronize())
	if i := cuFirstDiff(src[:end], dst[:end]); i >= 0 {
		t.Fatalf("%s: the round trip of %d pieces differs at byte %d of %d", name, len(up), i, end)
	}

	type method struct {
		name string
		run  func() error
	}
	// measure runs every method once per round, rotating the order, and
	// returns GiB/s samples per method after one warm-up round.
	measure := func(ms []method) [][]float64 {
		out := make([][]float64, len(ms))
		for round := -1; round < 5; round++ {
			for k := range ms {
				i := (k + max(round, 0)) % len(ms)
				start := time.Now()
				cuMust(t, ms[i].name, ms[i].run())
				cuMust(t, "Synchronize", s.Synchronize())
				if round >= 0 {
					out[i] = append(out[i], total/time.Since(start).Seconds()/(1<<30))
				}
			}
		}
		return out
	}
	type shape struct{ ctas, threads int }
	shapes := []shape{{16, 512}, {16, 256}, {32, 128}, {64, 128}}
	if strings.HasPrefix(name, "bulk") {
		shapes = []shape{{16, 32}, {32, 32}, {132, 32}}
	}
	kernel := func(kind CopyKind, ops []Copy, sh shape) func() error {
		return func() error {
			if err := kc.SetKernelCopyOptions(KernelCopyOptions{CTAs: sh.ctas, ThreadsPerCTA: sh.threads}); err != nil {
				return err
			}
			return kc.CopyKernel(kind, ops)
		}
	}
	for _, bs := range []int{16 << 10, 64 << 10, 256 << 10} {
		n := total / bs
		perm := rand.New(rand.NewPCG(1, uint64(bs))).Perm(4 * n)[:n]
		up, down := make([]Copy, n), make([]Copy, n)
		for i, b := range perm {
			up[i] = Copy{Dst: uint64(dev) + uint64(b*bs), Src: HostAddr(host[i*bs:]), Bytes: int64(bs)}
			down[i] = Copy{Dst: up[i].Src, Src: up[i].Dst, Bytes: int64(bs)}
		}
		for _, kind := range []CopyKind{HostToDevice, DeviceToHost} {
			ops := up
			if kind == DeviceToHost {
				ops = down
			}
			large := fmt.Sprintf("%s %s one large copy", kind, bytesize.Format(int64(bs)))
			var ms []method
			if baselines {
				one := []Copy{{Dst: uint64(dev), Src: HostAddr(host), Bytes: total}}
				if kind == DeviceToHost {
					one[0].Dst, one[0].Src = one[0].Src, one[0].Dst
				}
				ms = append(ms, method{large, func() error { return s.CopyBatch(kind, one) }})
				for _, chunk := range []uint{4096, 256} {
					ms = append(ms, method{fmt.Sprintf("%s %s cuMemcpyBatchAsync, calls of %d", kind, bytesize.Format(int64(bs)), chunk), func() error {
						SetBatchChunk(d, chunk)
						defer SetBatchChunk(d, 0)
						return s.CopyBatch(kind, ops)
					}})
				}
			}
			for _, sh := range shapes {
				ms = append(ms, method{fmt.Sprintf("%s %s kernel %s %dx%d", kind, bytesize.Format(int64(bs)), name, sh.ctas, sh.threads), kernel(kind, ops, sh)})
			}
			for i, g := range measure(ms) {
				base := large
				if ms[i].name == large {
					base = ""
				}
				row := res.Add(ms[i].name, "GiB/s", g, base)
				t.Logf("%s: %.2f GiB/s (%.2f-%.2f)", row.Name, row.Median, row.Min, row.Max)
			}
		}
	}

	// Overlap with a one-wave compute kernel.
	ft := newCuFMATimer(t, d)
	defer ft.close()
	onboard := make([]Copy, total/(16<<10))
	for i, b := range rand.New(rand.NewPCG(3, 3)).Perm(4 * len(onboard))[:len(onboard)] {
		onboard[i] = Copy{Dst: uint64(dev) + uint64(b)<<14, Src: HostAddr(host[i<<14:]), Bytes: 16 << 10}
	}
	// fma times one launch; copyBefore and copyAfter start the onboard
	// before or after the launch (nil: none).
	fma := func(copyBefore, copyAfter func() error) float64 {
		if copyBefore != nil {
			cuMust(t, "copy", copyBefore())
		}
		cuMust(t, "LaunchFMA", ft.launch(4, 1<<19))
		if copyAfter != nil {
			cuMust(t, "copy", copyAfter())
		}
		el := ft.elapsed(t)
		cuMust(t, "Synchronize", s.Synchronize())
		return el.Seconds() * 1e3
	}
	alone := fmt.Sprintf("compute (FMA, one wave, %s build) alone", name)
	var aloneMs []float64
	rows := map[string][]float64{}
	var order []string
	for round := -1; round < 5; round++ {
		a := fma(nil, nil)
		if round >= 0 {
			aloneMs = append(aloneMs, a)
		}
		for k := range shapes {
			sh := shapes[(k+max(round, 0))%len(shapes)]
			cp := kernel(HostToDevice, onboard, sh)
			for _, placed := range []string{"copy", "compute"} {
				var ms float64
				if placed == "copy" {
					ms = fma(cp, nil)
				} else {
					ms = fma(nil, cp)
				}
				key := fmt.Sprintf("compute (FMA, one wave, %s build) during a 16KiB onboard by kernel %s %dx%d, %s placed first", name, name, sh.ctas, sh.threads, placed)
				if round >= 0 {
					if _, ok := rows[key]; !ok {
						order = append(order, key)
					}
					rows[key] = append(rows[key], ms)
				}
			}
		}
	}
	res.Add(alone, "ms", aloneMs, "")
	slices.Sort(order)
	for _, key := range order {
		row := res.Add(key, "ms", rows[key], alone)
		t.Logf("%s: %.2f ms, %.3f of alone", row.Name, row.Median, row.Ratio)
	}
}

// cuFirstDiff is the first index where a and b differ, or -1.
func cuFirstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}
