package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"strings"

	"kvtier.dev/internal/checksum"
	"kvtier.dev/kvtier/stack"
)

// The remote tier's flags: the cluster, the deployment's prefix, and the
// protections the remote package prescribes for a shared cluster (an ACL
// user and its password, a checksum key, TLS). Secrets come from files of
// mode 0600, never from the command line (which ps shows every user).

// remoteOptions are stack.Options.Remote as the -remote flags give them;
// nil without -remote. Errors name the flag.
func remoteOptions(c *config) (*stack.RemoteOptions, error) {
	if c.remote == "" {
		return nil, nil
	}
	r := &stack.RemoteOptions{Addrs: strings.Split(c.remote, ","), Prefix: c.remotePrefix, Username: c.remoteUser, OpTimeout: c.remoteOpTimeout}
	if c.remotePasswordFile != "" {
		pw, err := readSecret("-remote-password-file", c.remotePasswordFile)
		if err != nil {
			return nil, err
		}
		r.Password = string(pw)
	}
	if c.remoteChecksumKeyFile != "" {
		key, err := readSecret("-remote-checksum-key-file", c.remoteChecksumKeyFile)
		if err != nil {
			return nil, err
		}
		if len(key) < checksum.MinKeyBytes {
			return nil, fmt.Errorf("-remote-checksum-key-file %s: %d bytes, want at least %d (e.g. head -c 32 /dev/urandom)", c.remoteChecksumKeyFile, len(key), checksum.MinKeyBytes)
		}
		r.ChecksumKey = key
	}
	var err error
	r.TLS, err = remoteTLS(c)
	return r, err
}

// remoteTLS is the TLS configuration of -remote-tls, -remote-tls-ca and
// -remote-tls-cert/-key; nil when none is given.
func remoteTLS(c *config) (*tls.Config, error) {
	if !c.remoteTLS && c.remoteTLSCA == "" && c.remoteTLSCert == "" {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.remoteTLSCA != "" {
		pem, err := os.ReadFile(c.remoteTLSCA)
		if err != nil {
			return nil, fmt.Errorf("-remote-tls-ca: %w", err)
		}
		t.RootCAs = x509.NewCertPool()
		if !t.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-remote-tls-ca %s: no PEM certificate in it", c.remoteTLSCA)
		}
	}
	if c.remoteTLSCert != "" {
		key, err := readSecret("-remote-tls-key", c.remoteTLSKey)
		if err != nil {
			return nil, err
		}
		cert, err := os.ReadFile(c.remoteTLSCert)
		if err != nil {
			return nil, fmt.Errorf("-remote-tls-cert: %w", err)
		}
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("-remote-tls-cert %s and -remote-tls-key %s: %w", c.remoteTLSCert, c.remoteTLSKey, err)
		}
		t.Certificates = []tls.Certificate{pair}
	}
	return t, nil
}

// maxSecretBytes bounds what readSecret reads: a password, a key or a PEM
// key, not a file named by mistake.
const maxSecretBytes = 64 << 10

// readSecret reads the secret in the file at path, given by flag: a
// regular file that neither group nor others may read, not empty, less
// one trailing newline.
func readSecret(flag, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: %w", flag, err)
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%s %s is not a regular file", flag, path)
	case fi.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("%s %s may be read by group or others (mode %04o): a secret must not be; chmod 600 it", flag, path, fi.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretBytes+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s %s: %w", flag, path, err)
	case len(b) > maxSecretBytes:
		return nil, fmt.Errorf("%s %s is more than %d bytes: not a secret", flag, path, maxSecretBytes)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	if len(b) == 0 {
		return nil, fmt.Errorf("%s %s is empty", flag, path)
	}
	return b, nil
}
