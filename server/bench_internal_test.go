package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"
)

func freeLoopback(b *testing.B) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startBenchServer starts a single durable dlockd Server (fsync on, quiet
// logs, 100 ms Raft timeouts) on free loopback ports with its data in a
// temp dir, waits until it is ready, and closes it when the benchmark ends.
func startBenchServer(b *testing.B) *Server {
	b.Helper()
	cfg := DefaultConfig()
	cfg.Listen, cfg.RaftBind, cfg.DataDir = freeLoopback(b), freeLoopback(b), b.TempDir()
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 100*time.Millisecond, 100*time.Millisecond, 100*time.Millisecond
	cfg.RaftLogLevel = "off"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkRaftPath_AcquireRelease measures the server without gRPC: 64
// goroutines call acquire and release on the Server directly (fsync on), so
// the figure is the Raft + bbolt + FSM ceiling that the API path shares.
func BenchmarkRaftPath_AcquireRelease(b *testing.B) {
	s := startBenchServer(b)
	const workers = 64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	var next sync.Mutex
	n := 0
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprint("bench/raft/", w)
			for i := 0; ; i++ {
				next.Lock()
				if n >= b.N {
					next.Unlock()
					return
				}
				n++
				next.Unlock()
				owner := fmt.Sprintf("owner-%d-%d-0123456789", w, i)
				if _, err := s.acquire(context.Background(), acquireIn{key: key, owner: owner, ttl: time.Minute}, nil, nil); err != nil {
					b.Error(err)
					return
				}
				if _, err := s.release(key, owner); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cycles/s")
}
