package remotetier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/remote"
)

// Tier connects a Manager to a remote tier shared by many servers. It is
// safe for concurrent use. See the package doc for a request's path.
type Tier struct {
	m        *kvtier.Manager
	cache    *remote.Cache
	host     func(kvtier.Slot) []byte
	maxFetch int
	codec    codec.Codec // Config.Codec

	admMu sync.Mutex
	adm   policy.Admitter[kvtier.Key]
	known *known

	fetched, fetchMisses, published, notAdmitted, removed atomic.Uint64

	log  *slog.Logger
	warn warnings
}

// Config configures a Tier.
type Config struct {
	// Cache is the remote tier. Its BlockBytes MUST be at most the host
	// tier's SlotBytes: a block is the first BlockBytes of its host slot.
	Cache *remote.Cache
	// HostSlot returns the memory of a host slot, for example
	// transfer.HostLayout.Slot of the host tier. The Tier reads a slot only while
	// a lease holds its block ready there, and writes one only between
	// the Insert that reserved it and the Commit.
	HostSlot func(kvtier.Slot) []byte
	// Admitter filters what Publish sends, as TierConfig.Admitter does
	// for NVMe: Publish records each block and sends it only if admitted.
	// Nil means policy.SeenTwice with 65,536 counters (a block goes out
	// the second time a Publish names it). The Tier OWNS it.
	Admitter policy.Admitter[kvtier.Key]
	// MaxFetchBlocks bounds the blocks one Fetch reads. 0 means 256.
	MaxFetchBlocks int
	// Logger receives a Warn line when a fetch fails for a reason other
	// than an absent block: the store did not answer (or the breaker is
	// open), or a value did not verify (forged, another deployment's, or
	// damaged). At most one line per reason every WarnEvery, with the
	// count since the last. Nil means slog.Default().
	Logger *slog.Logger
	// Codec is how the remote tier holds blocks: the host tier's (a
	// block moves between them as it is), and Cache.BlockBytes its
	// encoded size. Publish labels what it sends with it, and Fetch asks
	// for blocks in it only (one in another is a corrupt miss, deleted):
	// a value that records another codec is never served. Zero is None,
	// the bf16 bytes the GPU holds.
	Codec codec.Codec
	// KnownBlocks sizes the set of blocks this server knows the remote
	// holds (it fetched or published them), which Publish does not send
	// again. A block the remote evicted is sent again once it has aged
	// out of the set. A block leaving the set is announced removed from
	// the remote tier (known.go says when). 0 means 16,384.
	KnownBlocks int
	// Now is the clock of the blocks' expiry (the Cache's TTL); nil means
	// time.Now.
	Now func() time.Time
}

// Stats counts what a Tier did; the Cache's Stats say what
// the remote store did.
type Stats struct {
	// Fetched: blocks Fetch brought into the host tier. FetchMisses:
	// blocks Fetch asked for and did not get.
	Fetched, FetchMisses uint64
	// Published: blocks Publish queued. NotAdmitted: blocks the Admitter
	// held back.
	Published, NotAdmitted uint64
	// Removed: blocks announced removed from the remote tier, each once:
	// those a fetch found gone (absent, a part missing, or a value that
	// did not verify and was deleted) that this server knew were there,
	// and those that left its known set (KnownBlocks full, or the
	// Cache's TTL past since their write).
	Removed uint64
}

// New connects m to cfg.Cache.
func New(m *kvtier.Manager, cfg Config) (*Tier, error) {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: remotetier.Config.%s: %s", kvtier.ErrConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case m == nil:
		return nil, fmt.Errorf("%w: New: nil manager", kvtier.ErrBadInput)
	case cfg.Cache == nil:
		return nil, bad("Cache", "is nil")
	case cfg.HostSlot == nil:
		return nil, bad("HostSlot", "is nil")
	case m.SlotBytes(kvtier.Host) == 0:
		return nil, bad("Cache", "the manager has no host tier to fetch into")
	case int64(cfg.Cache.BlockBytes()) > m.SlotBytes(kvtier.Host):
		return nil, bad("Cache", "BlockBytes %d exceed the host tier's SlotBytes %d", cfg.Cache.BlockBytes(), m.SlotBytes(kvtier.Host))
	case cfg.MaxFetchBlocks < 0:
		return nil, bad("MaxFetchBlocks", "%d is negative", cfg.MaxFetchBlocks)
	case cfg.KnownBlocks < 0:
		return nil, bad("KnownBlocks", "%d is negative", cfg.KnownBlocks)
	case cfg.Codec.Check() != nil:
		return nil, bad("Codec", "%v", cfg.Codec.Check())
	}
	if cfg.MaxFetchBlocks == 0 {
		cfg.MaxFetchBlocks = 256
	}
	if cfg.KnownBlocks == 0 {
		cfg.KnownBlocks = 16384
	}
	if cfg.Admitter == nil {
		a, err := policy.NewSeenTwice[kvtier.Key](1<<16, 1<<18, func(k kvtier.Key) uint64 { return uint64(k) })
		if err != nil {
			return nil, err
		}
		cfg.Admitter = a
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	r := &Tier{m: m, cache: cfg.Cache, host: cfg.HostSlot, maxFetch: cfg.MaxFetchBlocks, codec: cfg.Codec, adm: cfg.Admitter, log: log}
	var err error
	if r.known, err = newKnown(cfg.KnownBlocks, cfg.Cache.TTL(), cfg.Now, r.announceGone); err != nil {
		return nil, bad("KnownBlocks", "%v", err)
	}
	return r, nil
}

// Cache is the remote tier the Tier reads and writes, for its Stats.
func (r *Tier) Cache() *remote.Cache { return r.cache }

// Stats returns the counters so far.
func (r *Tier) Stats() Stats {
	return Stats{Fetched: r.fetched.Load(), FetchMisses: r.fetchMisses.Load(),
		Published: r.published.Load(), NotAdmitted: r.notAdmitted.Load(), Removed: r.removed.Load()}
}

// checkLease checks that l holds a Lookup of tokens by this manager, and
// returns the keys it looked up.
func (r *Tier) checkLease(op string, tokens []int32, l *kvtier.Lease) ([]kvtier.Key, error) {
	keys, ok := r.m.LeasedKeys(l)
	if !ok {
		return nil, fmt.Errorf("%w: remotetier.Tier.%s: the lease holds no lookup of this manager", kvtier.ErrBadInput, op)
	}
	if n := len(tokens) / r.m.BlockTokens(); n != len(keys) {
		return nil, fmt.Errorf("%w: remotetier.Tier.%s: %d full blocks of tokens, the lease looked up %d", kvtier.ErrBadInput, op, n, len(keys))
	}
	return keys, nil
}

func (r *Tier) meta(salt kvtier.Salt, tokens []int32, keys []kvtier.Key, pos int) remote.BlockMeta {
	bt := r.m.BlockTokens()
	m := remote.BlockMeta{Key: uint64(keys[pos]), Salt: uint64(salt), Position: pos, Tokens: tokens[pos*bt : (pos+1)*bt], Codec: uint8(r.codec)}
	if pos > 0 {
		m.Parent = uint64(keys[pos-1])
	}
	return m
}

// Fetch reads from the remote tier the blocks of tokens that l (a Lookup
// of salt and tokens, not yet planned or onboarded) lacks, inserts those
// that extend the cached prefix into the host tier, and looks l up again,
// so that Plan and Onboard see them. It returns the blocks it inserted.
// Blocks l holds outside the host tier (GPU, NVMe) are fetched too when the
// run of new blocks passes them, since the host tier needs every block of
// the prefix it inserts. Remote misses, timeouts and a full host tier make
// it fetch fewer; only a bad lease is an error.
func (r *Tier) Fetch(ctx context.Context, salt kvtier.Salt, tokens []int32, l *kvtier.Lease) (int, error) {
	leased, err := r.checkLease("Fetch", tokens, l)
	if err != nil {
		return 0, err
	}
	r.known.sweep()
	now := r.known.now()
	keys := append([]kvtier.Key(nil), leased...)
	n := len(keys)
	found := make([]bool, n)
	inHost := make([]bool, n)
	for i, b := range l.Blocks {
		found[b.Position] = true
		_, inHost[b.Position] = r.m.ReadySlot(l, i, kvtier.Host)
	}
	first := 0
	for first < n && found[first] {
		first++
	}
	if first == n {
		return 0, nil
	}
	// Read every block the host tier lacks, in order, up to maxFetch.
	var ops []remote.ReadOp
	var pos []int
	for p := 0; p < n && len(ops) < r.maxFetch; p++ {
		if !inHost[p] {
			ops = append(ops, remote.ReadOp{Meta: r.meta(salt, tokens, keys, p), Dst: make([]byte, r.cache.BlockBytes())})
			pos = append(pos, p)
		}
	}
	r.cache.Get(ctx, ops)
	got := make(map[int][]byte, len(ops))
	end := n // the prefix [0, end) is in the host tier or fetched
	for j, op := range ops {
		if op.Err != nil {
			if errors.Is(op.Err, remote.ErrBadInput) {
				return 0, fmt.Errorf("%w: Tier.Fetch: %w", kvtier.ErrBadInput, op.Err)
			}
			r.fetchMisses.Add(1)
			r.warnFetch(op.Err)
			r.noteGone(&op.Meta, op.Err)
			end = min(end, pos[j])
			continue
		}
		got[pos[j]] = op.Dst
		r.known.add(blockInfo(&op.Meta), now) // written at most a TTL ago
	}
	if len(ops) > 0 && len(ops) == r.maxFetch {
		end = min(end, pos[len(pos)-1]+1)
	}
	if end <= first {
		return 0, nil
	}
	inserted, err := r.insertHost(salt, tokens[:end*r.m.BlockTokens()], got)
	if err != nil {
		return 0, err
	}
	r.m.Release(l)
	if err := r.m.Lookup(salt, tokens, l); err != nil {
		return inserted, err
	}
	return inserted, nil
}

// insertHost inserts tokens' blocks into the host tier, writing the new
// ones from got (by position). A block to write that got lacks (another
// lease evicted its host copy since the lookup) abandons the insert.
func (r *Tier) insertHost(salt kvtier.Salt, tokens []int32, got map[int][]byte) (int, error) {
	var w kvtier.Lease
	written := 0
	var lost error
	// ErrNoSpace: the lease holds the blocks before the first that found
	// no slot, and those are worth having. Another error (a key taken by
	// a different block) abandons the insert: the blocks are recomputed.
	if err := r.m.Insert(salt, tokens, kvtier.Host, &w); err != nil && !errors.Is(err, kvtier.ErrNoSpace) {
		lost = err
	}
	for _, b := range w.Blocks {
		if lost != nil {
			break
		}
		if !b.Write {
			continue
		}
		p, ok := got[b.Position]
		if !ok {
			lost = fmt.Errorf("block %#x left the host tier during the fetch", uint64(b.Key))
			break
		}
		copy(r.host(b.Slot), p)
		written++
	}
	if lost != nil {
		written = 0
	}
	if err := r.m.Commit(&w, lost); err != nil {
		r.m.Release(&w)
		return 0, err
	}
	r.m.Release(&w)
	r.fetched.Add(uint64(written))
	return written, nil
}

// Publish offers the remote tier the blocks of l (a Lookup of salt and
// tokens) that have a ready host copy and that the Admitter admits, and
// that this server does not know the remote holds already. The writes are
// queued (remote.Cache.Put copies the host slot) and go out behind the
// request. It returns the blocks queued.
func (r *Tier) Publish(salt kvtier.Salt, tokens []int32, l *kvtier.Lease) (int, error) {
	keys, err := r.checkLease("Publish", tokens, l)
	if err != nil {
		return 0, err
	}
	r.known.sweep()
	now := r.known.now()
	bb := r.cache.BlockBytes()
	queued := 0
	for i, b := range l.Blocks {
		r.admMu.Lock()
		r.adm.Record(b.Key)
		ok := r.adm.Admit(b.Key)
		r.admMu.Unlock()
		if !ok {
			r.notAdmitted.Add(1)
			continue
		}
		if r.known.contains(b.Key) {
			continue
		}
		slot, ready := r.m.ReadySlot(l, i, kvtier.Host)
		if !ready {
			continue
		}
		meta := r.meta(salt, tokens, keys, b.Position)
		q, err := r.cache.Put(meta, r.host(slot)[:bb])
		if err != nil {
			return queued, err
		}
		if q {
			r.known.add(blockInfo(&meta), now)
			queued++
		}
	}
	r.published.Add(uint64(queued))
	return queued, nil
}

// noteGone announces block meta removed from the remote tier when err (a
// fetch's) says the remote no longer holds it: absent (never written,
// evicted or expired), a part missing, or a value that did not verify
// (another model's, forged, damaged: the read deleted it). A read the
// store did not answer says nothing, and announces nothing.
//
// It announces only blocks this server knows the remote held (it wrote
// them, found them there, or fetched them: the set Publish consults), so
// that a cold prompt's misses do not flood the stream with blocks nobody
// announced; a corrupt value, which the read deleted, is announced
// always. The block leaves the known set, so a later Publish writes it
// again. It costs no round trip: the fetch's own answer decides.
func (r *Tier) noteGone(meta *remote.BlockMeta, err error) {
	if !errors.Is(err, remote.ErrMiss) || errors.Is(err, remote.ErrUnavailable) || errors.Is(err, remote.ErrClosed) {
		return
	}
	if !r.known.remove(kvtier.Key(meta.Key)) && errors.Is(err, remote.ErrCorrupt) {
		r.announceGone(blockInfo(meta)) // the set's removal announced the others
	}
}

// announceGone announces info's block removed from the remote tier.
func (r *Tier) announceGone(info kvtier.BlockInfo) {
	r.removed.Add(1)
	if err := r.m.Announce(kvtier.BlockRemoved, kvtier.Remote, info, nil); err != nil {
		r.log.Debug("kvtier: a remote removal not announced", "key", uint64(info.Key), "err", err)
	}
}

func blockInfo(meta *remote.BlockMeta) kvtier.BlockInfo {
	return kvtier.BlockInfo{Key: kvtier.Key(meta.Key), Parent: kvtier.Key(meta.Parent), Salt: kvtier.Salt(meta.Salt), Position: meta.Position}
}

// Invalidate deletes the blocks of keys from the remote tier, so that no
// server fetches them again (the store is shared: every server loses them),
// and announces removed those this server knew were there. It returns the
// blocks it deleted; a delete the store refused is in the error, and the
// others go on. The keys are a salt's chain (Hasher), as Invalidate of the
// manager takes them; the remote's names carry no salt.
func (r *Tier) Invalidate(ctx context.Context, keys []kvtier.Key) (int, error) {
	var errs []error
	n := 0
	for _, k := range keys {
		if err := r.cache.Delete(ctx, uint64(k)); err != nil {
			errs = append(errs, fmt.Errorf("remotetier: invalidate block %#x: %w", uint64(k), err))
			continue
		}
		r.known.remove(k)
		n++
	}
	return n, errors.Join(errs...)
}

// InvalidateSalt deletes from the remote tier the blocks of salt that this
// server knows are there (its known set: those it published or fetched),
// as Invalidate does. The remote's names carry no salt, so a block of the
// salt that another server published, and this one never saw, stays.
func (r *Tier) InvalidateSalt(ctx context.Context, salt kvtier.Salt) (int, error) {
	return r.Invalidate(ctx, r.known.ofSalt(salt))
}
