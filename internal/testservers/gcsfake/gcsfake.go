// Package gcsfake runs fake-gcs-server (github.com/fsouza/fake-gcs-server,
// an implementation of Cloud Storage's JSON API) inside the test process,
// on a free loopback port, for the gcsdriver's tests, benchmarks and
// examples.
//
// It runs in-process rather than as a built binary because the fake keeps
// its objects in memory (its filesystem backend cannot hold object names
// with path segments over 255 bytes, which 512-byte keys make): in-process,
// Stop and Start close and reopen the listener on the same port while the
// objects stay, as a restarted durable server's would. Freeze holds every
// request without an answer (connections are still accepted), as a
// stopped server process would. It is a package of its own, not part of
// internal/testservers, so that only the tests that use it link the fake
// (and the Cloud Storage client it imports).
//
// The fake is a Go module in go.mod, fetched by the go command like any
// other dependency (scripts/test-deps/gcs.sh downloads it ahead of an
// offline test run); there is no binary to install.
package gcsfake

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/dlock-dev/dlock/internal/testservers"
)

// Server is a fake-gcs-server serving the JSON API on 127.0.0.1. All
// methods are safe for concurrent use.
type Server struct {
	fake *fakestorage.Server
	port int

	mu      sync.Mutex
	srv     *http.Server  // nil while stopped
	frozen  chan struct{} // closed when not frozen
	stopped chan struct{} // closed by the test's cleanup: releases held requests
	drops   []drop

	handled atomic.Int64
}

// drop is a plan to apply matching requests but lose their replies.
type drop struct {
	match func(*http.Request) bool
	left  int
}

// Start starts a fake on a free loopback port with the given buckets
// created, and stops it (closing every connection) in t.Cleanup.
func Start(t testservers.TB, buckets ...string) *Server {
	t.Helper()
	fake, err := fakestorage.NewServerWithOptions(fakestorage.Options{NoListener: true, Scheme: "http"})
	if err != nil {
		t.Fatalf("gcsfake: %v", err)
	}
	for _, b := range buckets {
		fake.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: b})
	}
	s := &Server{fake: fake, frozen: make(chan struct{}), stopped: make(chan struct{})}
	close(s.frozen)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("gcsfake: %v", err)
	}
	s.port = ln.Addr().(*net.TCPAddr).Port
	s.serve(ln)
	t.Cleanup(func() {
		close(s.stopped)
		_ = s.Stop()
		fake.Stop()
	})
	return s
}

// Addr returns "127.0.0.1:port".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Endpoint returns the endpoint URL parameter of a gs:// URL for this
// server: "http://127.0.0.1:port".
func (s *Server) Endpoint() string { return "http://" + s.Addr() }

// URL returns the store URL of bucket and prefix on this server,
// gs://bucket/prefix?endpoint=http://127.0.0.1:port.
func (s *Server) URL(bucket, prefix string) string {
	return fmt.Sprintf("gs://%s/%s?endpoint=%s", bucket, prefix, s.Endpoint())
}

// Fake returns the fake itself, for reading and writing objects around
// the JSON API.
func (s *Server) Fake() *fakestorage.Server { return s.fake }

// Handled returns how many requests the server has answered (or held,
// or dropped the replies of) so far.
func (s *Server) Handled() int64 { return s.handled.Load() }

func (s *Server) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(s.handle), ReadHeaderTimeout: 10 * time.Second}
	s.srv = srv
	go func() { _ = srv.Serve(ln) }()
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	s.handled.Add(1)
	s.mu.Lock()
	frozen := s.frozen
	s.mu.Unlock()
	select {
	case <-frozen:
	case <-s.stopped:
		return
	}
	// A held request is applied after the thaw even when its client has
	// gone, as a stopped server process would once continued.
	if s.takeDrop(r) {
		rec := httptest.NewRecorder()
		s.fake.HTTPHandler().ServeHTTP(rec, r)
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				_ = c.Close()
				return
			}
		}
		panic(http.ErrAbortHandler) // closes the connection without a reply
	}
	s.fake.HTTPHandler().ServeHTTP(w, r)
}

func (s *Server) takeDrop(r *http.Request) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.drops {
		if s.drops[i].left > 0 && s.drops[i].match(r) {
			s.drops[i].left--
			return true
		}
	}
	return false
}

// DropReplies makes the next n requests that match be applied by the fake
// and then lose their replies: the connection is closed without an
// answer, as when the network drops a reply. match may read r.Method and
// r.URL only (not the body).
func (s *Server) DropReplies(n int, match func(r *http.Request) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drops = append(s.drops, drop{match: match, left: n})
}

// Dropped returns how many planned reply drops are still to come.
func (s *Server) Dropped() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, d := range s.drops {
		n += d.left
	}
	return n
}

// Stop closes the listener and every open connection; the objects stay
// for Start. Stopping a stopped server is a no-op. The error is always
// nil (it fits dlocktest.Harness.StopStore).
func (s *Server) Stop() error {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
	return nil
}

// Start listens again on the same port, with the same objects. Starting a
// running server is a no-op. It retries for up to 5 s while the port is
// still in use.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return nil
	}
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ln, err = net.Listen("tcp", s.Addr())
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("gcsfake: listen on %s again: %w", s.Addr(), err)
	}
	s.serve(ln)
	return nil
}

// Freeze makes the server hold every request, new and pending, without an
// answer until Thaw; connections are still accepted. Freezing a frozen
// server is a no-op.
func (s *Server) Freeze() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.frozen:
		s.frozen = make(chan struct{})
	default:
	}
	return nil
}

// Thaw ends Freeze: the held requests are served. Thawing a server that
// is not frozen is a no-op.
func (s *Server) Thaw() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.frozen:
	default:
		close(s.frozen)
	}
	return nil
}

// Object reads an object's attributes around the JSON API: its generation
// and metadata (nil, an error matching ErrNotFound when absent).
func (s *Server) Object(bucket, name string) (fakestorage.ObjectAttrs, error) {
	o, err := s.fake.GetObject(bucket, name)
	if err != nil {
		return fakestorage.ObjectAttrs{}, fmt.Errorf("%w: %s/%s: %v", ErrNotFound, bucket, name, err)
	}
	return o.ObjectAttrs, nil
}

// ErrNotFound: Object found no such object.
var ErrNotFound = errors.New("gcsfake: no such object")
