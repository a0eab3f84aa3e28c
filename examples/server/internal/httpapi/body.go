package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"kvtier.dev/internal/openai"
)

var (
	// errBodyTimeout marks a body not in within Config.BodyTimeout (408).
	errBodyTimeout = errors.New("body not received in time")
	// errDraining refuses a request once Drain began (503).
	errDraining = errors.New("the server is draining")
	// errClientGone ends a request whose client left before its body was
	// read: nothing is answered.
	errClientGone = errors.New("the client went away")
)

// aLongTimeAgo is a read deadline that has passed: setting it ends a read
// in progress at once.
var aLongTimeAgo = time.Unix(1, 0)

// readRequest reads and checks a completion request's body (readBounded).
func (a *API) readRequest(w http.ResponseWriter, r *http.Request) (*openai.CompletionRequest, []int32, error) {
	var req *openai.CompletionRequest
	var toks []int32
	err := a.readBounded(w, r, func(body []byte) (err error) {
		req, toks, err = decodeRequest(body, a.limits, a.defaultMax)
		return err
	})
	return req, toks, err
}

// readBounded reads a request's body and decodes it: at most MaxBodyBytes
// (a Content-Length over it is refused unread), by BodyTimeout after the
// handler began, holding one of the MaxDecodes turns while it reads and
// decodes (waiting for one before reading a byte). Drain ends the reads in
// progress and the waits (errDraining).
func (a *API) readBounded(w http.ResponseWriter, r *http.Request, decode func(body []byte) error) error {
	if a.drainCtx.Err() != nil {
		return errDraining
	}
	if r.ContentLength > a.maxBodyBytes {
		return fmt.Errorf("%w: Content-Length %d is over %d bytes", errBodyTooLarge, r.ContentLength, a.maxBodyBytes)
	}
	rc := http.NewResponseController(w)
	// A writer without deadlines (a test's recorder) reads without one.
	_ = rc.SetReadDeadline(time.Now().Add(a.bodyTimeout))
	select {
	case a.decodeTurns <- struct{}{}:
	case <-a.drainCtx.Done():
		return errDraining
	case <-r.Context().Done():
		return errClientGone
	}
	a.m.decoding.Inc()
	defer func() {
		a.m.decoding.Dec()
		<-a.decodeTurns
	}()
	aborted := make(chan struct{})
	stop := context.AfterFunc(a.drainCtx, func() {
		_ = rc.SetReadDeadline(aLongTimeAgo)
		close(aborted)
	})
	body, err := readBody(http.MaxBytesReader(w, r.Body, a.maxBodyBytes), r.ContentLength)
	if err == nil {
		err = decode(body)
	}
	if !stop() {
		<-aborted // it MUST NOT touch the connection once the handler returned
		if errors.Is(err, errBodyTimeout) {
			return errDraining
		}
	}
	if err == nil {
		// The body is in. Without a deadline now, the server's wait for the
		// client to close (which cancels the request's context) lasts as
		// long as the answer. On an error the deadline stays: it bounds what
		// the server reads of the rest of the body before it answers.
		_ = rc.SetReadDeadline(time.Time{})
	}
	return err
}
