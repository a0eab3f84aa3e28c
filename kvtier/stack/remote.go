package stack

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/remote"
	"kvtier.dev/kvtier/remotetier"
)

// RemoteOptions make the shared remote tier (kvtier/remote on a Redis
// Cluster, through kvtier/remotetier): a lookup's missing blocks are
// fetched from it into the host tier, and host blocks are published to it.
type RemoteOptions struct {
	// Addrs are some of the cluster's nodes, host:port.
	Addrs []string
	// Prefix is this deployment's key prefix, e.g. "kvt:prod:" (empty:
	// remote's default). Open binds it to Options.Model and refuses a
	// prefix that holds another model's blocks.
	Prefix string
	// Username and Password are the deployment's ACL user's, limited to
	// the prefix (see remote.RedisConfig.Username). Empty: the default
	// user (with requirepass, Password alone).
	Username, Password string
	// TLS encrypts the connections (and with a client certificate
	// authenticates them). Nil: plain TCP.
	TLS *tls.Config
	// ChecksumKey keys the values' checksums (at least 16 bytes, the same
	// on every server of the deployment): a value written by anyone
	// without it fails its check and is never served. Without it, anyone
	// who can write the prefix can forge blocks, and Open logs a warning.
	ChecksumKey []byte
	// OpTimeout is each remote read's and write's deadline (0: the
	// remote package's, 500 ms).
	OpTimeout time.Duration
}

// ErrRemote marks Open's errors that come from the remote tier (it did
// not answer, or it refused the prefix), so that a server can name its
// flags.
var ErrRemote = errors.New("the remote tier")

// check checks r.
func (r *RemoteOptions) check(shards int) error {
	switch {
	case len(r.Addrs) == 0:
		return optionErr("Remote.Addrs", "is empty: name some of the cluster's nodes")
	case r.OpTimeout < 0:
		return optionErr("Remote.OpTimeout", "%v is negative", r.OpTimeout)
	case shards > 1:
		return optionErr("Remote", "with %d shards: the remote tier of a tensor-parallel cache is not supported yet", shards)
	}
	return nil
}

// openRemote connects c to the remote tier o.Remote describes, binds its
// prefix to o.Model and warns when its checksums are unkeyed. blockBytes
// is a block's payload. Its errors wrap ErrRemote.
func (c *Cache) openRemote(ctx context.Context, o *Options, blockBytes int64) error {
	if err := c.connectRemote(ctx, o, blockBytes); err != nil {
		return fmt.Errorf("%w: %w", ErrRemote, err)
	}
	return nil
}

func (c *Cache) connectRemote(ctx context.Context, o *Options, blockBytes int64) error {
	r := o.Remote
	st, err := remote.NewRedis(remote.RedisConfig{Addrs: r.Addrs, Username: r.Username, Password: r.Password, TLS: r.TLS})
	if err != nil {
		return fmt.Errorf("Options.Remote: %w", err)
	}
	c.remoteStore = st
	m := c.Manager
	announce := func(b remote.BlockMeta) { // the remote tier in the manager's events
		info := kvtier.BlockInfo{Key: kvtier.Key(b.Key), Parent: kvtier.Key(b.Parent), Salt: kvtier.Salt(b.Salt), Position: b.Position}
		if err := m.Announce(kvtier.BlockStored, kvtier.Remote, info, b.Tokens); err != nil {
			c.log.Debug("kvtier: a remote block not announced", "key", b.Key, "err", err)
		}
	}
	rc, err := remote.New(remote.Config{Store: st, Prefix: r.Prefix, BlockBytes: int(blockBytes), ChecksumKey: r.ChecksumKey,
		Model: o.Model.String(), OpTimeout: r.OpTimeout, OnStored: announce})
	if err != nil {
		return fmt.Errorf("Options.Remote: %w", err)
	}
	c.remoteCache = rc
	recorded, err := rc.CheckModel(ctx)
	if errors.Is(err, remote.ErrOtherModel) {
		return fmt.Errorf("Options.Remote.Prefix %q refused: %w", r.Prefix, err)
	}
	if err != nil {
		return fmt.Errorf("Options.Remote: %w", err)
	}
	if recorded {
		c.log.Info("kvtier: remote prefix bound to this model", "prefix", r.Prefix, "model", o.Model.String())
	}
	if !rc.Keyed() {
		c.log.Warn("kvtier: the remote tier's checksums are unkeyed: anyone who can write the prefix can forge blocks that this server then serves; set a checksum key (Options.Remote.ChecksumKey)",
			"prefix", r.Prefix)
	}
	host := c.Host
	c.Remote, err = remotetier.New(c.Manager, remotetier.Config{Cache: rc, Logger: c.log, Codec: o.Codecs.Remote,
		HostSlot: func(s kvtier.Slot) []byte { return host.Slot(int32(s)) }})
	if err != nil {
		return fmt.Errorf("Options.Remote: %w", err)
	}
	return nil
}

// closeRemote flushes the remote tier's queued writes (bounded by their
// connection timeout) and closes it.
func (c *Cache) closeRemote() error {
	var errs []error
	if c.remoteCache != nil {
		errs = append(errs, c.remoteCache.Close())
		c.remoteCache = nil
	}
	if c.remoteStore != nil {
		errs = append(errs, c.remoteStore.Close())
		c.remoteStore = nil
	}
	return errors.Join(errs...)
}
