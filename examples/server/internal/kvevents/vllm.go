package kvevents

import "kvtier.dev/kvtier"

// Tags of vLLM's event types.
const (
	tagStored  = "BlockStored"
	tagRemoved = "BlockRemoved"
	tagCleared = "AllBlocksCleared"
)

// Medium is the medium vLLM's events name tier t by.
func Medium(t kvtier.Tier) string {
	switch t {
	case kvtier.GPU:
		return "GPU"
	case kvtier.Host:
		return "CPU"
	case kvtier.NVMe:
		return "DISK"
	case kvtier.Remote:
		return "REMOTE"
	}
	return t.String()
}

// AppendBatch appends to b the msgpack EventBatch of evs at ts (seconds
// since the epoch): one vLLM event per block event, and one
// AllBlocksCleared for a run of TierCleared (vLLM's clears every medium).
func AppendBatch(b []byte, ts float64, evs []kvtier.BlockEvent) []byte {
	n := 0
	for i, ev := range evs {
		if ev.Kind != kvtier.TierCleared || i == 0 || evs[i-1].Kind != kvtier.TierCleared {
			n++
		}
	}
	b = appendArrayHeader(b, 2)
	b = appendFloat64(b, ts)
	b = appendArrayHeader(b, n)
	for i, ev := range evs {
		switch ev.Kind {
		case kvtier.BlockStored:
			b = appendArrayHeader(b, 7)
			b = appendString(b, tagStored)
			b = appendArrayHeader(b, 1)
			b = appendUint(b, uint64(ev.Key))
			if ev.FirstToken == 0 {
				b = appendNil(b)
			} else {
				b = appendUint(b, uint64(ev.Parent))
			}
			b = appendArrayHeader(b, len(ev.Tokens))
			for _, t := range ev.Tokens {
				b = appendInt(b, int64(t))
			}
			b = appendInt(b, int64(ev.NumTokens))
			b = appendNil(b) // lora_id: a LoRA adapter is a salt here
			b = appendString(b, Medium(ev.Tier))
		case kvtier.BlockRemoved:
			b = appendArrayHeader(b, 3)
			b = appendString(b, tagRemoved)
			b = appendArrayHeader(b, 1)
			b = appendUint(b, uint64(ev.Key))
			b = appendString(b, Medium(ev.Tier))
		default: // TierCleared
			if i > 0 && evs[i-1].Kind == kvtier.TierCleared {
				continue
			}
			b = appendArrayHeader(b, 1)
			b = appendString(b, tagCleared)
		}
	}
	return b
}
