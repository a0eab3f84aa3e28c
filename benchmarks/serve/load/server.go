package main

import (
	"bufio"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// server is the model server under load: its process, its flags, its URL
// and the lines it logs.
type server struct {
	cmd    *exec.Cmd
	args   []string
	url    string
	exited chan error // its exit, once its log has been read to the end
	logMu  sync.Mutex
	log    []string
}

// startServer starts c.server on a loopback address free a moment ago and
// reads its log. Once it has started, the caller MUST call kill.
func startServer(c *config) (*server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &server{url: "http://" + addr, exited: make(chan error, 1)}
	s.args = append([]string{"-addr", addr}, strings.Fields(c.serverFlags)...)
	s.cmd = exec.Command(c.server, s.args...)
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("-server: %w", err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			s.logMu.Lock()
			s.log = append(s.log, sc.Text())
			s.logMu.Unlock()
		}
		s.exited <- s.cmd.Wait()
	}()
	return s, nil
}

// kill kills the server unless it has exited.
func (s *server) kill() {
	if s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
	}
}

// stop sends the server SIGTERM and waits at most 2 minutes for it to
// exit. exitErr is its exit's error, or says it did not exit; err is the
// signal's.
func (s *server) stop() (exitErr, err error) {
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return nil, err
	}
	select {
	case exitErr = <-s.exited:
	case <-time.After(2 * time.Minute):
		exitErr = errors.New("the server did not exit within 2 minutes of SIGTERM")
	}
	return exitErr, nil
}

// logSummary reports whether the server's last log line says it stopped
// cleanly, and counts its WARN and ERROR lines.
func (s *server) logSummary() (clean bool, warnings int) {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	clean = len(s.log) > 0 && strings.Contains(s.log[len(s.log)-1], "stopped cleanly")
	for _, l := range s.log {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			warnings++
		}
	}
	return clean, warnings
}

// sampler reads the server's resident memory, Go heap in use and
// goroutines from its /metrics periodically, until stopped.
type sampler struct {
	stopc, done chan struct{}
	samples     []rssSample
	err         error // the scrape that ended the sampling
}

// startSampling samples url's /metrics once per every, timed from now.
func startSampling(url string, every time.Duration) *sampler {
	s := &sampler{stopc: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-s.stopc:
				return
			case <-tick.C:
				fams, err := scrape(url)
				if err != nil {
					s.err = fmt.Errorf("/metrics at %v: %w", time.Since(start).Round(time.Second), err)
					return
				}
				s.samples = append(s.samples, rssSample{time.Since(start), gauge(fams, "process_resident_memory_bytes"),
					gauge(fams, "go_memstats_heap_inuse_bytes"), gauge(fams, "go_goroutines")})
			}
		}
	}()
	return s
}

// stop ends the sampling and returns the samples, or the error that ended
// it early.
func (s *sampler) stop() ([]rssSample, error) {
	close(s.stopc)
	<-s.done
	return s.samples, s.err
}
