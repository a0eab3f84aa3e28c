package stack

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/cespare/xxhash/v2"

	"kvtier.dev/kvtier"
)

// Model names the model whose KV a cache holds: KV is only valid for the
// weights, shapes, KV dtype and tokenizer that computed it. A fine-tune of
// the same architecture has other weights, so its cache is another's.
type Model struct {
	// Weights identifies the weights: a digest of their files, e.g.
	// "sha256:9f2c…", or "seed:1" for weights generated from a seed.
	// Required when any other field is set.
	Weights string
	// Shape is the architecture as text, e.g. "llama-3.1-8b layers=32
	// hidden=4096 heads=32/8 head_dim=128 vocab=128256 rope=500000".
	Shape string
	// DType is the KV cache's element type, e.g. "bf16".
	DType string
	// Tokenizer identifies the tokenizer, e.g. a digest of its file, or
	// "bytes" for byte-level token ids.
	Tokenizer string
}

// String is the model's identity as the tiers record it.
func (m Model) String() string {
	if m == (Model{}) {
		return ""
	}
	return fmt.Sprintf("weights=%s shape=%s dtype=%s tokenizer=%s", m.Weights, m.Shape, m.DType, m.Tokenizer)
}

func (m Model) check() error {
	if m != (Model{}) && strings.TrimSpace(m.Weights) == "" {
		return optionErr("Model.Weights", "is empty, with Model %q: name the weights (a digest of their files, or seed:N): KV is bound to them", m.String())
	}
	return nil
}

// salt is the model's part of every block's salt: the first 8 bytes of
// the SHA-256 of its identity; 0 for the zero Model.
func (m Model) salt() uint64 {
	if m == (Model{}) {
		return 0
	}
	d := sha256.Sum256([]byte(m.String()))
	return binary.LittleEndian.Uint64(d[:8])
}

// Salt is tenant's salt in a cache of this model: tenant folded with the
// model's identity, as Cache.Salt does. With the zero Model it is tenant.
func (m Model) Salt(tenant kvtier.Salt) kvtier.Salt { return foldSalt(m.salt(), tenant) }

func foldSalt(model uint64, tenant kvtier.Salt) kvtier.Salt {
	if model == 0 {
		return tenant
	}
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], model)
	binary.LittleEndian.PutUint64(b[8:], uint64(tenant))
	return kvtier.Salt(xxhash.Sum64(b[:]))
}

// Salt is the salt of tenant's blocks in this cache: tenant folded with
// the cache's Options.Model, so that no block computed by another model
// (another server sharing the remote prefix, or a directory written by
// other weights) is ever a hit, even where every checksum holds. Every
// Lookup, Insert, Prefetch and remote Fetch or Publish MUST use it, as a
// server does once per request. With the zero Model it is tenant.
func (c *Cache) Salt(tenant kvtier.Salt) kvtier.Salt { return foldSalt(c.modelSalt, tenant) }
