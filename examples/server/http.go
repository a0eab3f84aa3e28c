package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"kvtier.dev/examples/server/internal/httpapi"
)

// httpFlags bound what a client can hold of the server: the time to send
// a request and to take its answer, an idle connection's life, and the
// connections open at once.
type httpFlags struct {
	headerTimeout, bodyTimeout, writeTimeout, idleTimeout time.Duration
	maxConns                                              int // 0: defaultMaxConns
}

func (h *httpFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&h.headerTimeout, "header-timeout", 10*time.Second, "how long a client may take to send a request's headers")
	fs.DurationVar(&h.bodyTimeout, "body-timeout", 30*time.Second, "how long a client may take to send a completion request's body, from its headers on (then 408)")
	fs.DurationVar(&h.writeTimeout, "write-timeout", 30*time.Second, "how long a client may take to accept one write of its answer (a streamed chunk, or a whole answer) before it is cut off")
	fs.DurationVar(&h.idleTimeout, "idle-timeout", 30*time.Second, "how long an idle keep-alive connection stays open")
	fs.IntVar(&h.maxConns, "max-conns", 0, "connections open at once; more wait to be accepted (0: 1024, or half the open-file limit, ulimit -n, when that is lower: the other half is the tiers' and Redis's)")
}

func (h *httpFlags) validate() error {
	switch {
	case h.headerTimeout <= 0:
		return errors.New("-header-timeout must be positive")
	case h.bodyTimeout <= 0:
		return errors.New("-body-timeout must be positive")
	case h.writeTimeout <= 0:
		return errors.New("-write-timeout must be positive")
	case h.idleTimeout <= 0:
		return errors.New("-idle-timeout must be positive")
	case h.maxConns < 0:
		return fmt.Errorf("-max-conns %d is negative", h.maxConns)
	}
	if limit, ok := openFileLimit(); ok && uint64(h.maxConns) >= limit {
		return fmt.Errorf("-max-conns %d: the open-file limit (ulimit -n) is %d, and the server needs files of its own", h.maxConns, limit)
	}
	return nil
}

// connLimit is -max-conns, its default filled.
func (h *httpFlags) connLimit() int {
	if h.maxConns > 0 {
		return h.maxConns
	}
	const fallback = 1024
	if limit, ok := openFileLimit(); ok && limit/2 < fallback {
		return max(int(limit/2), 1)
	}
	return fallback
}

// serve serves api on ln, with at most connLimit connections open, until
// srv is shut down.
func (h *httpFlags) serve(api http.Handler, ln net.Listener) (srv *http.Server, served <-chan error) {
	srv = &http.Server{Handler: api, ReadHeaderTimeout: h.headerTimeout, IdleTimeout: h.idleTimeout}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(httpapi.LimitListener(ln, h.connLimit())) }()
	return srv, done
}
