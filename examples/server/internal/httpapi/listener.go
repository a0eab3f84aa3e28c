package httpapi

import (
	"errors"
	"net"
	"sync"
)

// LimitListener returns ln with at most n of its connections open at once:
// Accept waits for one of them to close before it accepts another (the
// kernel's backlog holds the clients meanwhile). A server bounds its file
// descriptors so, whatever its clients do. Close ends the waits with
// net.ErrClosed.
func LimitListener(ln net.Listener, n int) net.Listener {
	return &limitListener{Listener: ln, open: make(chan struct{}, n), closed: make(chan struct{})}
}

type limitListener struct {
	net.Listener
	open      chan struct{} // a token per connection open
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.open <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.open
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.open }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitConn gives its token back on its first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes a TCP connection: the server does so before it
// closes one on which a client may still be sending (a body refused
// unread), so that the client reads the answer before a reset.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
