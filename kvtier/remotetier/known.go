package remotetier

import (
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"kvtier.dev/kvtier"
)

// known is the set of blocks this server knows the remote holds: it
// published them or fetched them. Publish does not send them again, and
// the manager's event stream has them in the remote tier until they leave
// the set, which announces them removed (BlockRemoved, Remote) whatever the
// reason: a fetch found them gone, the set's capacity pushed them out (the
// server no longer vouches for them), or the store's TTL has passed since
// they were written (it deleted them). So a router that indexes the stream
// holds no remote block this server stopped knowing about, and holds each
// block at most a sweep's period past its TTL.
//
// Entries are added once and never refreshed, so the set's oldest entry
// is also the first to expire: a sweep takes entries from the old end while
// they are due, touching no others.
type known struct {
	set *lru.Cache[kvtier.Key, knownBlock]
	ttl time.Duration // the store's; 0: blocks do not expire
	now func() time.Time

	mu        sync.Mutex // a sweep at a time
	nextSweep time.Time
}

// knownBlock is what a removal announces, and when the store deletes it.
type knownBlock struct {
	info    kvtier.BlockInfo
	expires time.Time // zero: never
}

// sweepEvery bounds how often a sweep runs: expired blocks are announced
// at most this long late, while the tier is used.
const sweepEvery = time.Second

func newKnown(size int, ttl time.Duration, now func() time.Time, gone func(kvtier.BlockInfo)) (*known, error) {
	set, err := lru.NewWithEvict(size, func(_ kvtier.Key, b knownBlock) { gone(b.info) })
	if err != nil {
		return nil, err
	}
	return &known{set: set, ttl: ttl, now: now}, nil
}

// add puts info's block in the set unless it is there; written says when
// it was (or will be) written, for its expiry.
func (k *known) add(info kvtier.BlockInfo, written time.Time) {
	if k.set.Contains(info.Key) {
		return
	}
	b := knownBlock{info: info}
	if k.ttl > 0 {
		b.expires = written.Add(k.ttl)
	}
	k.set.Add(info.Key, b)
}

func (k *known) contains(key kvtier.Key) bool { return k.set.Contains(key) }

// remove takes key out of the set (announcing it) and reports whether it
// was there.
func (k *known) remove(key kvtier.Key) bool { return k.set.Remove(key) }

// sweep removes the expired blocks, at most once every sweepEvery.
func (k *known) sweep() {
	if k.ttl <= 0 {
		return
	}
	now := k.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if now.Before(k.nextSweep) {
		return
	}
	k.nextSweep = now.Add(sweepEvery)
	for {
		key, b, ok := k.set.GetOldest()
		if !ok || now.Before(b.expires) {
			return
		}
		k.set.Remove(key)
	}
}

// ofSalt returns the keys of the set's blocks of salt.
func (k *known) ofSalt(salt kvtier.Salt) []kvtier.Key {
	var keys []kvtier.Key
	for _, key := range k.set.Keys() {
		if b, ok := k.set.Peek(key); ok && b.info.Salt == salt {
			keys = append(keys, key)
		}
	}
	return keys
}
