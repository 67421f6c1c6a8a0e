package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func testConfig(t testing.TB) Config {
	t.Helper()
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	cfg := DefaultConfig()
	cfg.Listen, cfg.RaftBind, cfg.DataDir = free(), free(), t.TempDir()
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	cfg.RaftLogLevel = "off"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return cfg
}

// TestServer_BecomeLeaderIsRetried: a failure to take up leadership (a
// barrier that timed out, a purge that could not commit) used to leave the
// node unready for good; it is retried while the node stays the leader.
func TestServer_BecomeLeaderIsRetried(t *testing.T) {
	var fails atomic.Int32
	becomeLeaderHook = func() error {
		if fails.Add(1) <= 3 {
			return errors.New("injected failure")
		}
		return nil
	}
	t.Cleanup(func() { becomeLeaderHook = nil })
	s, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatalf("never ready after 3 failed attempts: %v", err)
	}
	if n := fails.Load(); n != 4 {
		t.Fatalf("%d attempts, want 4", n)
	}
}

// TestServer_ListOfManyKeysDoesNotStallAcquires measures what paged List
// costs others: with 200,000 held keys, 8 goroutines list pages of one key
// while an unrelated client acquires and releases. The figure (p50 and p99
// of those acquisitions) is logged; the bound is loose because the machine
// is shared (it was 189 ms at p50 when List copied and sorted every key).
// Set DLOCKD_LOAD=1 to run it.
func TestServer_ListOfManyKeysDoesNotStallAcquires(t *testing.T) {
	if os.Getenv("DLOCKD_LOAD") == "" {
		t.Skip("load figure: set DLOCKD_LOAD=1")
	}
	cfg := testConfig(t)
	cfg.NoSync = true
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	const keys = 200000
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < keys; i += 16 {
				if _, err := s.acquire(ctx, acquireIn{key: fmt.Sprintf("bulk/%07d", i), owner: "owner-bulk-0000", ttl: time.Hour}, nil, nil); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	stop := make(chan struct{})
	var listers sync.WaitGroup
	var lists atomic.Int64
	for range 8 {
		listers.Add(1)
		go func() {
			defer listers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, _, err := s.list(context.Background(), "", "", 1); err != nil {
					t.Error(err)
					return
				}
				lists.Add(1)
			}
		}()
	}
	var lat []time.Duration
	for i := range 500 {
		t0 := time.Now()
		key := fmt.Sprintf("other/%d", i)
		if _, err := s.acquire(ctx, acquireIn{key: key, owner: "owner-other-00", ttl: time.Minute}, nil, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.release(key, "owner-other-00"); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	close(stop)
	listers.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	t.Logf("200k keys, 8 listers (%d lists): acquire+release p50 %v p99 %v", lists.Load(), p50, p99)
	if p99 > 100*time.Millisecond {
		t.Fatalf("acquire+release p99 %v with listers running", p99)
	}
}

// TestServer_ReadsWriteNothingAfterRestart: a linearizable read (Inspect, a
// refused try) writes no log entry, also after a restart, when the new
// term's Raft no-op and barrier never reached the FSM (every read used to
// write a barrier and wait for its fsync).
func TestServer_ReadsWriteNothingAfterRestart(t *testing.T) {
	cfg := testConfig(t)
	ctx := t.Context()
	start := func() *Server {
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		if err := s.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := start()
	if _, err := s.acquire(ctx, acquireIn{key: "k", owner: "owner-a-0000", ttl: time.Hour}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = start()
	defer s.Close()
	before := s.raft.LastIndex()
	for range 50 {
		if _, held, err := s.inspect("k"); err != nil || !held {
			t.Fatalf("inspect after restart: held=%v %v", held, err)
		}
		if _, err := s.acquire(ctx, acquireIn{key: "k", owner: "owner-b-0000", ttl: time.Second}, nil, nil); err == nil {
			t.Fatal("a try of a held key was granted")
		}
	}
	if after := s.raft.LastIndex(); after != before {
		t.Fatalf("100 reads after a restart moved the log from %d to %d", before, after)
	}
}

// TestServer_RefusesDataDirOfAnotherNode: a data directory written by
// another node ID is refused at start with a clear error (it used to start
// and stay unready for good).
func TestServer_RefusesDataDirOfAnotherNode(t *testing.T) {
	cfg := testConfig(t)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.NodeID = "another-node"
	s, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Start()
	defer s.Close()
	if err == nil || !strings.Contains(err.Error(), `does not name --node-id "another-node"`) || !strings.Contains(err.Error(), "empty the data dir") {
		t.Fatalf("start on another node's data dir: %v", err)
	}
}
