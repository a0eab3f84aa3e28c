package main

import (
	"fmt"
	"strings"

	"kvtier.dev/internal/bytesize"
	"kvtier.dev/internal/results"
)

// sizeNote describes the store of this block size.
func (b *bench) sizeNote() string {
	info := b.info
	return fmt.Sprintf("%s: %d slots of %d bytes, %s I/O, alignment %d bytes (%s), preallocated %v",
		bytesize.Format(int64(b.bs)), b.nslots, info.SlotBytes, info.Mode, info.AlignBytes, info.AlignSource, info.Preallocated)
}

// addCaseRows adds case c's rows to res: throughput and CPU per block,
// raw, diagnostic and tier (and with --gpu, raw+copy and the tier with GPU
// sums). It returns the tier's CPU rows, plain and with GPU sums.
func (b *bench) addCaseRows(res *results.File, c int, t *tally) (tierCPU, gpuCPU results.Row) {
	cs, size := cases[c], bytesize.Format(int64(b.bs))
	gibps := func(m mode) []float64 { return t.gibps[caseMode{c, m}] }
	cpu := func(m mode) []float64 { return t.cpuPerBlock[caseMode{c, m}] }
	base := fmt.Sprintf("raw O_DIRECT %s %s", cs.name, size)
	res.Add(base, "GiB/s", gibps(modeRaw), "")
	if !cs.write {
		addNoted(res, fmt.Sprintf("raw O_DIRECT+header %s %s", cs.name, size), "GiB/s", gibps(modeRawHdr), base,
			"diagnostic: the tier's bytes (header region + payload) in one raw preadv")
	}
	addNoted(res, fmt.Sprintf("raw O_DIRECT+touch %s %s", cs.name, size), "GiB/s", gibps(modeRawTouch), base,
		"diagnostic: raw, plus one SIMD pass over the payload's bytes (the floor of any full checksum)")
	res.Add(fmt.Sprintf("kvtier/nvme %s %s", cs.name, size), "GiB/s", gibps(modeTier), base)
	cpuBase := fmt.Sprintf("raw O_DIRECT %s %s CPU", cs.name, size)
	res.Add(cpuBase, "CPU µs/block", cpu(modeRaw), "")
	addNoted(res, fmt.Sprintf("raw O_DIRECT+touch %s %s CPU", cs.name, size), "CPU µs/block", cpu(modeRawTouch), cpuBase,
		"diagnostic: raw plus one pass over the payload")
	tierCPU = res.Add(fmt.Sprintf("kvtier/nvme %s %s CPU", cs.name, size), "CPU µs/block", cpu(modeTier), cpuBase)
	if b.gpu != nil {
		copyName := fmt.Sprintf("raw O_DIRECT+copy %s %s", cs.name, size)
		addNoted(res, copyName, "GiB/s", gibps(modeRawCopy), base,
			"raw, plus the payload's copy to or from the GPU (what any GPU server adds), no checksum")
		res.Add(fmt.Sprintf("kvtier/nvme, GPU sums %s %s", cs.name, size), "GiB/s", gibps(modeTierGPU), base)
		addNoted(res, copyName+" CPU", "CPU µs/block", cpu(modeRawCopy), cpuBase, "raw plus the copy to or from the GPU")
		gpuCPU = res.Add(fmt.Sprintf("kvtier/nvme, GPU sums %s %s CPU", cs.name, size), "CPU µs/block", cpu(modeTierGPU), cpuBase)
	}
	return tierCPU, gpuCPU
}

// addNoted adds a row with a note to res.
func addNoted(res *results.File, name, unit string, samples []float64, baseline, note string) {
	r := res.Add(name, unit, samples, baseline)
	r.Note = note
	res.Rows[len(res.Rows)-1] = r
}

// caseNote is case c's part of the size's note: the tier's CPU per block
// against raw's, every mode's CPU per block and, where the device's
// counters can be read, its requests per block.
func (b *bench) caseNote(c int, t *tally, tierCPU, gpuCPU results.Row) string {
	cs := cases[c]
	blocks := float64(b.nslots * b.o.rounds)
	note := fmt.Sprintf("; %s tier CPU per block %.2fx raw's (medians of rounds)", cs.name, 1/tierCPU.Ratio)
	if b.gpu != nil {
		note += fmt.Sprintf("; %s tier with GPU sums CPU per block %.2fx raw's", cs.name, 1/gpuCPU.Ratio)
	}
	note += fmt.Sprintf("; %s CPU µs per block (user+system, this process):", cs.name)
	for m := range numModes {
		if d, ok := t.cpu[caseMode{c, m}]; ok {
			note += fmt.Sprintf(" %s %.1f,", modeNames[m], float64(d.Microseconds())/blocks)
		}
	}
	note = strings.TrimSuffix(note, ",")
	if b.dev.ok() {
		note += fmt.Sprintf("; %s device requests per block:", cs.name)
		for m := range numModes {
			if d, ok := t.reqs[caseMode{c, m}]; ok {
				note += fmt.Sprintf(" %s %s,", modeNames[m], d.per(blocks))
			}
		}
		note = strings.TrimSuffix(note, ",")
	}
	return note
}
