package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvtier.dev/internal/openai"
)

// tlsFiles are a test CA, a server certificate for 127.0.0.1 and a client
// certificate, as PEM files.
type tlsFiles struct{ ca, serverCert, serverKey, clientCert, clientKey string }

// makeTLSFiles writes a CA and two certificates signed by it into dir.
func makeTLSFiles(t *testing.T, dir string) tlsFiles {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	now := time.Now()
	caKey := newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvtier test CA"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	f := tlsFiles{ca: write("ca.pem", "CERTIFICATE", caDER, 0o644)}
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage, ips []net.IP) (cert, key string) {
		k := newKey()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name}, NotBefore: now.Add(-time.Hour),
			NotAfter: now.Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der, 0o644), write(name+".key", "PRIVATE KEY", kder, 0o600)
	}
	f.serverCert, f.serverKey = leaf(2, "server", x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	f.clientCert, f.clientKey = leaf(3, "client", x509.ExtKeyUsageClientAuth, nil)
	return f
}

// startTLSRedis starts one redis-server (not a cluster: redistest's
// clusters speak plain TCP) that accepts only TLS clients with a
// certificate of f's CA, and returns its address. It is stopped when t
// ends.
func startTLSRedis(t *testing.T, f tlsFiles) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir := t.TempDir()
	cmd := exec.Command(bin, "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1", "--protected-mode", "no",
		"--tls-cert-file", f.serverCert, "--tls-key-file", f.serverKey, "--tls-ca-cert-file", f.ca, "--tls-auth-clients", "yes",
		"--dir", dir, "--save", "", "--appendonly", "no", "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	pair, err := tls.LoadX509KeyPair(f.clientCert, f.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(f.ca)
	pool.AppendCertsFromPEM(caPEM)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}
	for deadline := time.Now().Add(20 * time.Second); ; {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("redis-server with TLS exited: %v\n%s", err, log)
		default:
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, cfg)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server with TLS on %s did not answer: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestServeRemoteTLS: against a node that takes only TLS clients with a
// certificate of its CA, the server connects with -remote-tls-ca,
// -remote-tls-cert and -remote-tls-key and serves; without its
// certificate, or over plain TCP, it refuses to start, naming -remote.
func TestServeRemoteTLS(t *testing.T) {
	f := makeTLSFiles(t, t.TempDir())
	addr := startTLSRedis(t, f)
	base := []string{"-remote", addr, "-remote-prefix", "kvserve-test-tls:"}
	runErr := func(extra ...string) error {
		c, err := parseArgs(testArgs(append(slices.Clone(base), extra...)...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		c.log = slog.New(slog.DiscardHandler)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return run(ctx, &c, nil)
	}
	for name, extra := range map[string][]string{"plain TCP": nil, "no client certificate": {"-remote-tls-ca", f.ca}} {
		if err := runErr(extra...); err == nil || !strings.Contains(err.Error(), "-remote") {
			t.Errorf("%s: %v, want an error naming -remote", name, err)
		}
	}
	looseKey := filepath.Join(t.TempDir(), "client.key")
	b, _ := os.ReadFile(f.clientKey)
	if err := os.WriteFile(looseKey, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := runErr("-remote-tls-ca", f.ca, "-remote-tls-cert", f.clientCert, "-remote-tls-key", looseKey); err == nil || !strings.Contains(err.Error(), "-remote-tls-key") {
		t.Errorf("a client key of mode 0644: %v, want it refused naming -remote-tls-key", err)
	}
	if err := runErr("-remote-tls-ca", f.serverCert+".missing"); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "-remote-tls-ca") {
		t.Errorf("a missing CA file: %v, want an error naming -remote-tls-ca", err)
	}
	s := start(t, testArgs(append(base, "-remote-tls-ca", f.ca, "-remote-tls-cert", f.clientCert, "-remote-tls-key", f.clientKey)...)...)
	if !strings.Contains(s.logs.String(), "tls=true") || !strings.Contains(s.logs.String(), "bound to this model") {
		t.Errorf("the log does not show the TLS remote tier bound:\n%s", s.logs)
	}
	p := tokenPrompt(18, 25)
	if got, want := s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(4)}), s.noCacheTokens(t, p); !slices.Equal(got.Tokens, want) {
		t.Errorf("tokens %v, want %v", got.Tokens, want)
	}
	if err := s.shutdown(); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, s.logs)
	}
}
