package kvevents

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// ZMTP 3.1 (ZeroMQ RFC 37) with the NULL mechanism: the greeting, the
// READY handshake and the framing, as much as a PUB and a ROUTER socket
// need on their side of a TCP connection.

const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04

	greetingLen      = 64
	maxFrameBytes    = 1 << 20 // the largest frame a peer may send
	handshakeTimeout = 5 * time.Second
)

// errProtocol marks a peer that broke ZMTP; the connection is dropped.
var errProtocol = errors.New("zmtp: protocol error")

// zconn is one connection after the handshake. Writes are serialized by
// wmu (the reader answers PINGs while a writer sends messages).
type zconn struct {
	c        net.Conn
	r        *bufio.Reader
	peerType string
	wmu      sync.Mutex
}

// greeting is ours: signature, version 3.1, mechanism NULL, not as-server.
func greeting() []byte {
	g := make([]byte, greetingLen)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 1
	copy(g[12:32], "NULL")
	return g
}

// handshake exchanges greetings and READY commands on c as a socket of
// type socketType, and accepts a peer whose socket type is in accept.
func handshake(c net.Conn, socketType string, accept []string) (*zconn, error) {
	if err := c.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return nil, err
	}
	z := &zconn{c: c, r: bufio.NewReaderSize(c, 16<<10)}
	if _, err := c.Write(greeting()); err != nil {
		return nil, fmt.Errorf("zmtp: greeting: %w", err)
	}
	var g [greetingLen]byte
	if _, err := io.ReadFull(z.r, g[:]); err != nil {
		return nil, fmt.Errorf("zmtp: the peer's greeting: %w", err)
	}
	switch mech := string(g[12:32]); {
	case g[0] != 0xff || g[9] != 0x7f:
		return nil, fmt.Errorf("%w: the peer's greeting has no ZMTP signature", errProtocol)
	case g[10] < 3:
		return nil, fmt.Errorf("%w: the peer speaks ZMTP %d.%d, not 3", errProtocol, g[10], g[11])
	case mech != "NULL"+string(make([]byte, 16)):
		return nil, fmt.Errorf("%w: the peer's mechanism %q is not NULL", errProtocol, trimZero(mech))
	}
	ready := appendFrame(nil, flagCommand, readyBody(socketType))
	if _, err := c.Write(ready); err != nil {
		return nil, fmt.Errorf("zmtp: READY: %w", err)
	}
	flags, body, err := z.readFrame()
	if err != nil {
		return nil, err
	}
	name, props, ok := command(body)
	if flags&flagCommand == 0 || !ok || name != "READY" {
		return nil, fmt.Errorf("%w: the peer's first frame is not READY", errProtocol)
	}
	z.peerType = props["Socket-Type"]
	if !slices.Contains(accept, z.peerType) {
		return nil, fmt.Errorf("%w: a %s socket cannot talk to a %q peer", errProtocol, socketType, z.peerType)
	}
	return z, c.SetDeadline(time.Time{})
}

func trimZero(s string) string {
	for len(s) > 0 && s[len(s)-1] == 0 {
		s = s[:len(s)-1]
	}
	return s
}

// readyBody is a READY command with the Socket-Type property.
func readyBody(socketType string) []byte {
	b := append([]byte{5}, "READY"...)
	b = append(b, byte(len("Socket-Type")))
	b = append(b, "Socket-Type"...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(socketType)))
	return append(b, socketType...)
}

// command splits a command frame's body into its name and, for READY, its
// properties; ok is false for a malformed body.
func command(body []byte) (name string, props map[string]string, ok bool) {
	if len(body) < 1 || len(body) < 1+int(body[0]) {
		return "", nil, false
	}
	name, rest := string(body[1:1+int(body[0])]), body[1+int(body[0]):]
	if name != "READY" {
		return name, nil, true
	}
	props = map[string]string{}
	for len(rest) > 0 {
		n := int(rest[0])
		if len(rest) < 1+n+4 {
			return "", nil, false
		}
		key := string(rest[1 : 1+n])
		vlen := binary.BigEndian.Uint32(rest[1+n:])
		rest = rest[1+n+4:]
		if uint64(len(rest)) < uint64(vlen) {
			return "", nil, false
		}
		props[key] = string(rest[:vlen])
		rest = rest[vlen:]
	}
	return name, props, true
}

// commandData is what follows a command's name in its body.
func commandData(body []byte) []byte { return body[1+int(body[0]):] }

// readFrame reads one frame. The body is a new slice.
func (z *zconn) readFrame() (flags byte, body []byte, err error) {
	flags, err = z.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	if flags&^(flagMore|flagLong|flagCommand) != 0 {
		return 0, nil, fmt.Errorf("%w: frame flags %#x", errProtocol, flags)
	}
	var size uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err := io.ReadFull(z.r, b[:]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(b[:])
	} else {
		b, err := z.r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		size = uint64(b)
	}
	if size > maxFrameBytes {
		return 0, nil, fmt.Errorf("%w: a frame of %d bytes (at most %d)", errProtocol, size, maxFrameBytes)
	}
	body = make([]byte, size)
	if _, err := io.ReadFull(z.r, body); err != nil {
		return 0, nil, err
	}
	return flags, body, nil
}

// readMessage reads the frames of the next message, answering PING
// commands and passing the other commands to onCommand (nil: ignored).
func (z *zconn) readMessage(onCommand func(name string, data []byte)) ([][]byte, error) {
	var parts [][]byte
	for {
		flags, body, err := z.readFrame()
		if err != nil {
			return nil, err
		}
		if flags&flagCommand != 0 {
			name, _, ok := command(body)
			if !ok {
				return nil, fmt.Errorf("%w: a malformed command", errProtocol)
			}
			if name == "PING" {
				z.pong(commandData(body))
			} else if onCommand != nil {
				onCommand(name, commandData(body))
			}
			continue
		}
		parts = append(parts, body)
		if flags&flagMore == 0 {
			return parts, nil
		}
	}
}

// pong answers a PING (its 2-byte TTL, then the context to echo).
func (z *zconn) pong(ping []byte) {
	var ctx []byte
	if len(ping) > 2 {
		ctx = ping[2:]
	}
	body := append(append([]byte{4}, "PONG"...), ctx...)
	z.write(appendFrame(nil, flagCommand, body))
}

// write sends whole frames.
func (z *zconn) write(b []byte) error {
	z.wmu.Lock()
	defer z.wmu.Unlock()
	_, err := z.c.Write(b)
	return err
}

// appendFrame appends one frame (flags: more and command; the size form
// is chosen here).
func appendFrame(b []byte, flags byte, body []byte) []byte {
	if len(body) > 255 {
		b = append(b, flags|flagLong)
		b = binary.BigEndian.AppendUint64(b, uint64(len(body)))
	} else {
		b = append(b, flags, byte(len(body)))
	}
	return append(b, body...)
}

// appendMessage appends the frames of a message of parts.
func appendMessage(b []byte, parts ...[]byte) []byte {
	for i, p := range parts {
		flags := byte(0)
		if i < len(parts)-1 {
			flags = flagMore
		}
		b = appendFrame(b, flags, p)
	}
	return b
}
