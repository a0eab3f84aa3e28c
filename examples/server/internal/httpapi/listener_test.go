package httpapi

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"testing/synctest"
)

// TestLimitListener: with a limit of 2, a third connection is accepted only
// once one of the first two closes (closing it twice frees one place);
// Close ends an Accept that waits.
func TestLimitListener(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pipes := newPipeListener()
		ln := LimitListener(pipes, 2)
		var mu sync.Mutex
		var accepted []net.Conn
		acceptErr := make(chan error, 1)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					acceptErr <- err
					return
				}
				mu.Lock()
				accepted = append(accepted, c)
				mu.Unlock()
			}
		}()
		count := func() int {
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			return len(accepted)
		}
		var clients []net.Conn
		var dialing sync.WaitGroup
		for range 3 {
			dialing.Go(func() {
				c := pipes.dial() // waits until the listener takes it
				mu.Lock()
				clients = append(clients, c)
				mu.Unlock()
			})
		}
		if n := count(); n != 2 {
			t.Fatalf("%d connections accepted with a limit of 2", n)
		}
		mu.Lock()
		first := accepted[0]
		mu.Unlock()
		first.Close()
		first.Close()
		if n := count(); n != 3 {
			t.Fatalf("%d connections accepted once one closed, want 3", n)
		}
		dialing.Wait()
		ln.Close() // the accept loop waits for a place: Close ends the wait
		if err := <-acceptErr; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, c := range append(accepted, clients...) {
			c.Close()
		}
	})
}

// TestLimitConnCloseWrite: a limited TCP connection still half-closes, so
// that the server can answer a client that is still sending before it
// closes the connection.
func TestLimitConnCloseWrite(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitListener(tcp, 1)
	defer ln.Close()
	client, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	cw, ok := server.(interface{ CloseWrite() error })
	if !ok {
		t.Fatal("a limited connection has no CloseWrite")
	}
	server.Write([]byte("bye"))
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(client); err != nil || string(got) != "bye" {
		t.Fatalf("the client read %q, %v; want bye, then EOF", got, err)
	}
}
