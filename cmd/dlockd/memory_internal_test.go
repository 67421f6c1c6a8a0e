package main

import (
	"log/slog"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestShouldRelease(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name       string
		prev, now  heapState
		wantReturn bool
	}{
		{"quiet after a burst", heapState{allocs: 500 * mib}, heapState{allocs: 501 * mib, live: 45 * mib, excess: 60 * mib}, true},
		{"busy: the free memory is about to be reused", heapState{allocs: 500 * mib}, heapState{allocs: 540 * mib, live: 45 * mib, excess: 60 * mib}, false},
		{"little above the live heap", heapState{allocs: 500 * mib}, heapState{allocs: 500 * mib, live: 45 * mib, excess: 5 * mib}, false},
		{"under the floor", heapState{allocs: 10 * mib}, heapState{allocs: 10 * mib, live: 2 * mib, excess: 3 * mib}, false},
	} {
		if got := shouldRelease(c.prev, c.now); got != c.wantReturn {
			t.Errorf("%s: shouldRelease = %v, want %v", c.name, got, c.wantReturn)
		}
	}
}

// TestMemoryRelease_ReturnsBurstHeap holds a 32 MiB live heap (a lock
// table), allocates 96 MiB of garbage (a burst of requests), and waits
// for the heap above the live heap to be returned: without the release,
// the garbage and the pages a collection freed stay (the collector's goal
// is twice the live heap) until the next burst.
func TestMemoryRelease_ReturnsBurstHeap(t *testing.T) {
	live := make([][]byte, 0, 512)
	for range cap(live) {
		live = append(live, make([]byte, 64<<10))
	}
	runtime.GC()
	stop := startMemoryRelease(100*time.Millisecond, slog.New(slog.DiscardHandler))
	defer stop()
	var burst [][]byte
	for i := range 1536 {
		burst = append(burst, make([]byte, 64<<10))
		if i%64 == 63 {
			burst = burst[:0]
		}
	}
	burst = nil
	s := make([]metrics.Sample, len(heapSamples))
	for i, name := range heapSamples {
		s[i].Name = name
	}
	start := readHeap(s)
	deadline := time.Now().Add(10 * time.Second)
	for {
		h := readHeap(s)
		if h.excess < 8<<20 {
			t.Logf("heap above the live heap: %d MiB after the burst, %d MiB after %v", start.excess>>20, h.excess>>20, 10*time.Second-time.Until(deadline))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("heap above the live heap still %d MiB (live %d MiB) 10 s after the burst", h.excess>>20, h.live>>20)
		}
		time.Sleep(50 * time.Millisecond)
	}
	runtime.KeepAlive(live)
	runtime.KeepAlive(burst)
}
