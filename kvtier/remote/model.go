package remote

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// The prefix's model record, under <prefix>model (no hash tag: one key),
// little-endian:
//
//	0   magic "KVRM"
//	4   format version (uint16)
//	6   flags (uint16): bit 0 set when the checksum is keyed
//	8   checksum of bytes 16.. (as a block header's)
//	16  SHA-256 of Config.Model
//	48  Config.Model's first bytes (at most modelLabelBytes)
const (
	modelHeadBytes  = 48
	modelLabelBytes = 160
	modelVersion    = 1
)

var modelMagic = [4]byte{'K', 'V', 'R', 'M'}

// ErrOtherModel means the prefix holds the blocks of another model than
// Config.Model (or of a deployment with another ChecksumKey): see
// CheckModel.
var ErrOtherModel = errors.New("remote: the prefix belongs to another model")

// modelKey is the name of the prefix's model record.
func (c *Cache) modelKey() string { return c.cfg.Prefix + "model" }

// encodeModel returns the record of model.
func (c *Cache) encodeModel() []byte {
	label := c.cfg.Model[:min(len(c.cfg.Model), modelLabelBytes)]
	b := make([]byte, modelHeadBytes+len(label))
	le := binary.LittleEndian
	copy(b[0:4], modelMagic[:])
	le.PutUint16(b[4:], modelVersion)
	if c.sum.Keyed() {
		le.PutUint16(b[6:], flagKeyed)
	}
	d := sha256.Sum256([]byte(c.cfg.Model))
	copy(b[16:48], d[:])
	copy(b[48:], label)
	le.PutUint64(b[8:], c.sum.Of(b[16:]))
	return b
}

// decodeModel checks a record read back and returns the digest and label
// of the model it names.
func (c *Cache) decodeModel(b []byte) (digest [32]byte, label string, err error) {
	le := binary.LittleEndian
	switch {
	case len(b) < modelHeadBytes || len(b) > modelHeadBytes+modelLabelBytes:
		return digest, "", fmt.Errorf("is %d bytes, want %d to %d", len(b), modelHeadBytes, modelHeadBytes+modelLabelBytes)
	case [4]byte(b[0:4]) != modelMagic:
		return digest, "", fmt.Errorf("magic %q, want %q", b[0:4], modelMagic[:])
	case le.Uint16(b[4:]) != modelVersion:
		return digest, "", fmt.Errorf("format version %d, want %d", le.Uint16(b[4:]), modelVersion)
	case (le.Uint16(b[6:])&flagKeyed != 0) != c.sum.Keyed():
		return digest, "", fmt.Errorf("keyed=%v, this tier keyed=%v: written by a deployment with another Config.ChecksumKey", !c.sum.Keyed(), c.sum.Keyed())
	case c.sum.Of(b[16:]) != le.Uint64(b[8:]):
		return digest, "", errors.New("its checksum does not hold: written under another Config.ChecksumKey, or damaged")
	}
	copy(digest[:], b[16:48])
	return digest, string(b[48:]), nil
}

// CheckModel binds the prefix to Config.Model: it reads the prefix's
// model record and, where there is none, writes one (recorded is then
// true). A record of another model, or one that does not check under this
// Cache's ChecksumKey (another deployment's), is an error wrapping
// ErrOtherModel that names the prefix and, where it can, the other model:
// the caller refuses the prefix, since a prefix is one deployment's. A
// store that does not answer is an error too. Two servers of different
// models that bind a new prefix at the same moment may both succeed (the
// store has no compare-and-set here); their blocks still never meet,
// since the model is part of every block's salt (kvtier/stack).
func (c *Cache) CheckModel(ctx context.Context) (recorded bool, err error) {
	key := c.modelKey()
	dst := make([]byte, modelHeadBytes+modelLabelBytes)
	op := []GetOp{{Keys: []string{key}, Dst: [][]byte{dst}, Got: []int{0}}}
	tctx, cancel := context.WithTimeout(ctx, c.cfg.OpTimeout)
	c.cfg.Store.Get(tctx, op)
	cancel()
	switch got := op[0].Got[0]; {
	case op[0].Err != nil:
		return false, fmt.Errorf("remote: reading the model record %s: %w", key, op[0].Err)
	case got < 0:
		put := []PutOp{{Keys: []string{key}, Values: [][]byte{c.encodeModel()}}}
		c.cfg.Store.Put(ctx, put)
		if put[0].Err != nil {
			return false, fmt.Errorf("remote: writing the model record %s: %w", key, put[0].Err)
		}
		return true, nil
	case got > len(dst):
		return false, fmt.Errorf("%w: the record %s is more than %d bytes: not a model record of this tier; delete it, or give this deployment a prefix of its own",
			ErrOtherModel, key, len(dst))
	default:
		digest, label, err := c.decodeModel(dst[:got])
		if err != nil {
			return false, fmt.Errorf("%w: the record %s %w; give this deployment a prefix of its own, or delete the record to drop what the prefix holds", ErrOtherModel, key, err)
		}
		if digest != sha256.Sum256([]byte(c.cfg.Model)) {
			return false, fmt.Errorf("%w: prefix %q holds the blocks of model %q (record %s), not of %q: give this model a prefix of its own, or delete the record to drop the other model's blocks",
				ErrOtherModel, c.cfg.Prefix, label, key, c.cfg.Model[:min(len(c.cfg.Model), modelLabelBytes)])
		}
		return false, nil
	}
}

// Keyed reports whether the tier's checksums are keyed (Config.ChecksumKey).
// Unkeyed, whoever can write the prefix can forge blocks that verify.
func (c *Cache) Keyed() bool { return c.sum.Keyed() }
