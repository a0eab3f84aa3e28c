package httpapi

import (
	"bufio"
	"net"
	"net/http"
	"sync"
	"testing"
)

// pipeListener is an in-memory network for the tests run under
// testing/synctest (whose bubbles may not use the real one): dial hands
// the server one end of a net.Pipe, whose writes wait for the reader, and
// whose deadlines run on the bubble's clock.
type pipeListener struct {
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial returns the client's end of a new connection.
func (l *pipeListener) dial() net.Conn {
	client, server := net.Pipe()
	l.conns <- server
	return client
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// servePipes serves a over a pipeListener until the test ends.
func servePipes(t *testing.T, a *API) (*pipeListener, *http.Server) {
	l := newPipeListener()
	srv := &http.Server{Handler: a}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l, srv
}

// readResponse reads one response from c.
func readResponse(t *testing.T, c net.Conn) (*http.Response, error) {
	t.Helper()
	return http.ReadResponse(bufio.NewReader(c), nil)
}
