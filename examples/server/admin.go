package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"kvtier.dev/examples/server/internal/httpapi"
)

// adminFlags are the operator's API (httpapi.AdminPath): its own listen
// address, off by default, and the bearer token, read from a file of mode
// 0600 as the server's other secrets are.
type adminFlags struct {
	addr, tokenFile string
	// up, when set (by tests), is told the address once the API listens.
	up func(addr string)
}

func (a *adminFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.addr, "admin-addr", "", "serve the operator's API (/admin/v1/: evict, invalidate, pin, flush, drain, the tiers' state) on this address (host:port), behind -admin-token-file's bearer token (default: off)")
	fs.StringVar(&a.tokenFile, "admin-token-file", "", "with -admin-addr: a file (mode 0600) holding the bearer token the operator's API requires (one trailing newline is dropped)")
}

func (a *adminFlags) validate() error {
	switch {
	case a.addr != "" && a.tokenFile == "":
		return errors.New("-admin-addr without -admin-token-file: the operator's API is never served without a token")
	case a.addr == "" && a.tokenFile != "":
		return errors.New("-admin-token-file without -admin-addr: there is no operator's API to guard")
	}
	return nil
}

// adminShutdownTimeout bounds how long the operator's API waits for its
// calls in flight at exit.
const adminShutdownTimeout = 5 * time.Second

// startAdmin serves the operator's API on -admin-addr until p closes;
// drain begins the server's drain. Without -admin-addr it does nothing.
func startAdmin(c *config, p *parts, api *httpapi.API, drain func()) error {
	if c.admin.addr == "" {
		return nil
	}
	if p.cache == nil {
		return errors.New("-admin-addr with -strategy none: there is no cache to operate")
	}
	token, err := readSecret("-admin-token-file", c.admin.tokenFile)
	if err != nil {
		return err
	}
	h, err := api.Admin(httpapi.AdminConfig{Token: token, Drain: drain, Logger: c.log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.admin.addr)
	if err != nil {
		return fmt.Errorf("-admin-addr: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: c.http.headerTimeout, ReadTimeout: c.http.bodyTimeout, IdleTimeout: c.http.idleTimeout}
	go srv.Serve(httpapi.LimitListener(ln, 16))
	p.closers = append(p.closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), adminShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			return errors.Join(fmt.Errorf("-admin-addr shutdown: %w", err), srv.Close())
		}
		return nil
	})
	c.log.Info("server: operator's API listening", "admin_addr", ln.Addr().String())
	if c.admin.up != nil {
		c.admin.up(ln.Addr().String())
	}
	return nil
}
