package main

import (
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/gpu"
	"kvtier.dev/examples/server/internal/kvdrift"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/kvtier/codec/cudacodec"
)

// codecChunk is the most blocks one kernel launch (or one copy to the
// host, in Go) codes: 256 blocks of llama-3.1-8b are 256 MiB encoded.
const codecChunk = 256

// rig is the GPU, the model over its KV region and the codec's round trip.
// Each side of a prompt has perSide slots: the original blocks in [0,
// perSide), their round trip in [perSide, 2*perSide).
type rig struct {
	c       model.Config
	perSide int
	fw      kvdrift.Forwarder
	recoder kvdrift.Recoder
	kr      *kvdrift.KernelRecoder // nil on the Go path
	setup   string                 // the device, cuBLAS and the codec's path
	closers []func() error         // last first

	dev    cudastream.Device
	st     cudastream.Stream
	region cudastream.DevicePtr
}

// openRig opens GPU 0 and builds everything on it; on an error it closes
// what it built.
func openRig(c model.Config, f flags) (*rig, error) {
	r := &rig{c: c}
	if err := r.open(f); err != nil {
		return nil, errors.Join(err, r.close())
	}
	return r, nil
}

func (r *rig) open(f flags) error {
	dev, err := cudastream.Open(0)
	if err != nil {
		return err
	}
	r.dev = dev
	r.closers = append(r.closers, dev.Close)
	if r.st, err = dev.NewStream(0); err != nil {
		return err
	}
	r.closers = append(r.closers, r.st.Destroy)
	longest := f.cachedMax + f.tail
	s := kvdrift.Setup{Config: r.c, Steps: f.steps}
	r.perSide = s.SlotsPerSide(longest)
	if r.region, err = dev.Alloc(int64(2*r.perSide) * r.c.BlockBytes()); err != nil {
		return fmt.Errorf("KV region of %d blocks of %d bytes: %w", 2*r.perSide, r.c.BlockBytes(), err)
	}
	r.closers = append(r.closers, func() error { return dev.Free(r.region) })
	t0 := time.Now()
	m, err := gpu.New(r.c, f.seed, r.region, 2*r.perSide, gpu.Options{MaxTokens: longest, MaxContext: longest + f.steps})
	if err != nil {
		return err
	}
	r.fw = m
	r.closers = append(r.closers, m.Close)
	log.Printf("%s: %d params made on the GPU in %v; cuBLAS %s", r.c.Name, r.c.Params(), time.Since(t0).Round(time.Millisecond), m.Library())
	if err := r.openCodec(f.codec); err != nil {
		return err
	}
	path := "package codec in Go (blocks copied to the host and back)"
	switch {
	case f.codec == "none":
		path = "no codec (the baseline): the cached blocks copied as they are, the reference continuing from the one-shot prefill, so that reuse itself is set against no reuse"
	case r.kr != nil:
		path = "package cudacodec's kernels on the device (each prompt's first and last cached blocks checked against the Go reference, byte for byte)"
	}
	r.setup = fmt.Sprintf("device %s; cuBLAS %s; round trip through %s", dev.Info().Name, m.Library(), path)
	return nil
}

// openCodec loads the kernels (-codec kernels or auto) or sets up the Go
// round trip (-codec go, or auto when the kernels cannot load).
func (r *rig) openCodec(which string) error {
	reg := kvdrift.DeviceRegion{Base: r.region, BlockBytes: r.c.BlockBytes()}
	if which == "none" {
		r.recoder = kvdrift.CopyRecoder{St: r.st, Region: reg}
		return nil
	}
	if which != "go" {
		k, err := cudacodec.Load(r.dev)
		switch {
		case err == nil:
			r.closers = append(r.closers, k.Close)
			if r.kr, err = kvdrift.NewKernelRecoder(r.dev, k, r.st, reg, r.c, codecChunk); err != nil {
				return err
			}
			r.closers = append(r.closers, r.kr.Close)
			r.recoder = r.kr
			return nil
		case which == "kernels" || !errors.Is(err, cudastream.ErrNotSupported):
			return fmt.Errorf("-codec %s: %w", which, err)
		}
		log.Printf("the codec's kernels cannot load (%v): coding in Go", err)
	}
	g, err := kvdrift.NewGoDeviceRecoder(r.st, reg, r.c, codecChunk)
	if err != nil {
		return err
	}
	r.recoder = g
	return nil
}

// close releases everything, last built first.
func (r *rig) close() error {
	var errs []error
	for i := len(r.closers) - 1; i >= 0; i-- {
		errs = append(errs, r.closers[i]())
	}
	r.closers = nil
	return errors.Join(errs...)
}

// prompt is prompt i under f: a cached count uniform over whole blocks in
// [cachedMin, cachedMax], then tail more tokens, every token uniform over
// the vocabulary, all from a generator seeded by (seed, i).
func prompt(c model.Config, f flags, i int) kvdrift.Prompt {
	r := rand.New(rand.NewPCG(f.seed, uint64(i)))
	bt := c.BlockTokens
	cached := f.cachedMin + bt*r.IntN((f.cachedMax-f.cachedMin)/bt+1)
	tok := make([]int32, cached+f.tail)
	for j := range tok {
		tok[j] = int32(r.IntN(c.Vocab))
	}
	return kvdrift.Prompt{Tokens: tok, Cached: cached}
}

// runAll runs every prompt, logging progress every tenth of the run, and
// returns the results and how long they took.
func (r *rig) runAll(f flags) ([]kvdrift.Result, time.Duration, error) {
	s := kvdrift.Setup{Config: r.c, Model: r.fw, Recoder: r.recoder, Steps: f.steps, Tolerance: f.tolerance, OneShotReference: f.codec == "none"}
	ref, rec := span(0, r.perSide), span(r.perSide, r.perSide)
	rs := make([]kvdrift.Result, 0, f.prompts)
	t0 := time.Now()
	for i := range f.prompts {
		p := prompt(r.c, f, i)
		res, err := kvdrift.Run(s, p, ref, rec)
		if err != nil {
			return nil, 0, fmt.Errorf("prompt %d (%d cached tokens): %w", i, p.Cached, err)
		}
		if r.kr != nil {
			k := p.Cached / r.c.BlockTokens
			for _, b := range []int{0, k - 1} {
				if err := r.kr.Check(ref[b], rec[b]); err != nil {
					return nil, 0, fmt.Errorf("prompt %d, block %d: %w", i, b, err)
				}
			}
		}
		rs = append(rs, res)
		if done := i + 1; done%max(1, f.prompts/10) == 0 || done == f.prompts {
			sum, el := kvdrift.Summarize(rs), time.Since(t0)
			log.Printf("%d/%d prompts in %v (%.2f s each): %d agree, %d near ties, %d differ; largest tail drift %.3g (%.3g of the spread)",
				done, f.prompts, el.Round(time.Second), el.Seconds()/float64(done), sum.Agree, sum.Ties, sum.Differences, sum.Prefill.Abs, sum.Prefill.OfStd)
		}
	}
	return rs, time.Since(t0), nil
}

// span is n slots from from.
func span(from, n int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(from + i)
	}
	return s
}
