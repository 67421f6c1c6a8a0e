package main

import (
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
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

func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name                    string
		base                    int
		live, scanned, headroom uint64
		want                    int
	}{
		{"small live heap: Go's minimum heap sets the bound", 100, 1 * mib, 2 * mib, 16 * mib, 425},
		{"many stacks: the scanned bytes set the bound", 100, 2 * mib, 10 * mib, 16 * mib, 160},
		{"large live heap: gc-percent leaves more room", 100, 64 * mib, 66 * mib, 16 * mib, 100},
		{"a lower gc-percent", 50, 20 * mib, 20 * mib, 16 * mib, 80},
		{"scanned below live is taken as live", 100, 20 * mib, 0, 16 * mib, 100},
		{"no headroom", 100, 1 * mib, 2 * mib, 0, 100},
		{"live heap unknown", 100, 0, 0, 16 * mib, 100},
		{"GC off stays off", -1, 1 * mib, 2 * mib, 16 * mib, -1},
		{"a tiny live heap is capped", 100, 1, 1, 1 << 50, math.MaxInt32},
		{"the largest headroom does not overflow", 100, 64 * mib, 64 * mib, math.MaxInt64, math.MaxInt32},
		{"the largest live heap", 100, math.MaxUint64, math.MaxUint64, 16 * mib, 100},
	} {
		if got := gcPercentFor(c.base, c.live, c.scanned, c.headroom); got != c.want {
			t.Errorf("%s: gcPercentFor(%d, %d, %d, %d) = %d, want %d", c.name, c.base, c.live, c.scanned, c.headroom, got, c.want)
		}
	}
}

// gcPercent reads the collector's current GC percentage.
func gcPercent(t *testing.T) int {
	t.Helper()
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Fatalf("/gc/gogc:percent: kind %v", s[0].Value.Kind())
	}
	return int(s[0].Value.Uint64())
}

// TestGCHeadroom_FollowsTheLiveHeap: with a small live heap the GC
// percentage is raised so that the heap may grow by the headroom between
// collections; once the live heap outgrows the headroom, a collection
// brings it back to gc-percent; stop restores gc-percent.
func TestGCHeadroom_FollowsTheLiveHeap(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	runtime.GC()
	stop := startGCHeadroom(100, 256<<20)
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	awaitPercent := func(what string, ok func(int) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok(gcPercent(t)) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: GC percentage %d after 10 s", what, gcPercent(t))
			}
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The test binary's live heap is a few MiB: 256 MiB of headroom is
	// many times it.
	awaitPercent("small live heap", func(p int) bool { return p > 1000 })
	// The heap may grow by the headroom, not by a multiple of it: Go's
	// percentage applies to the stacks and globals too, which a small live
	// heap does not outweigh.
	goal := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}, {Name: "/gc/heap/live:bytes"}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		time.Sleep(20 * time.Millisecond) // the cleanup runs after the collection
		metrics.Read(goal)
		room := float64(goal[0].Value.Uint64()) - float64(goal[1].Value.Uint64())
		if room >= 0.85*(256<<20) && room <= 1.2*(256<<20) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("heap goal %d B with %d B live: room %.0f MiB, want about the headroom (256 MiB)", goal[0].Value.Uint64(), goal[1].Value.Uint64(), room/(1<<20))
		}
	}

	// 384 MiB live (pointer-free, so cheap to hold): gc-percent's room
	// (384 MiB) is more than the headroom.
	live := make([][]byte, 0, 384)
	for range cap(live) {
		live = append(live, make([]byte, 1<<20))
	}
	awaitPercent("large live heap", func(p int) bool { return p == 100 })
	runtime.KeepAlive(live)
	live = nil
	awaitPercent("small again", func(p int) bool { return p > 1000 })

	stop()
	stopped = true
	if p := gcPercent(t); p != 100 {
		t.Errorf("after stop: GC percentage %d, want gc-percent (100)", p)
	}
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	if p := gcPercent(t); p != 100 {
		t.Errorf("a collection after stop: GC percentage %d, want 100 (the headroom kept adjusting)", p)
	}
}

// TestGCHeadroom_OffStartsNothing: no headroom, or GC off, leaves the
// percentage alone.
func TestGCHeadroom_OffStartsNothing(t *testing.T) {
	old := debug.SetGCPercent(70)
	defer debug.SetGCPercent(old)
	for _, c := range []struct {
		base     int
		headroom uint64
	}{{70, 0}, {-1, 16 << 20}} {
		stop := startGCHeadroom(c.base, c.headroom)
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
		if p := gcPercent(t); p != 70 {
			t.Errorf("startGCHeadroom(%d, %d): GC percentage %d, want 70 untouched", c.base, c.headroom, p)
		}
		stop()
	}
}
