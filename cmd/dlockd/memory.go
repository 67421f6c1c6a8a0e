package main

// memory.go returns to the OS the heap memory a burst of allocation left
// behind (--release-memory-after), and keeps the collector from running
// many times a second while the live heap is small (--gc-headroom-bytes).
//
// Go's collector lets the heap grow to twice the live heap (GOGC=100)
// before it collects, and its background scavenger keeps what a
// collection freed as long as it fits under that goal: after a burst (say
// 100,000 acquisitions), garbage and freed pages equal to the whole lock
// table stay resident while the server sits idle with its leases held.
// Once allocation has gone quiet, one debug.FreeOSMemory (a full
// collection, then every free page returned) brings the resident size back
// to about the live heap. While the server is busy nothing happens: the
// freed memory is about to be reused, and a forced collection would only
// cost CPU.

import (
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// Heap release thresholds: the heap memory above the live heap must be at
// least releaseMinExcess and a releaseMinShare of the live heap, and the
// allocation during the quiet period less than a releaseQuietShare of
// that excess (the heap would take several periods to reuse it).
const (
	releaseMinExcess  = 4 << 20
	releaseMinShare   = 8 // excess >= live / releaseMinShare
	releaseQuietShare = 4 // allocated < excess / releaseQuietShare
)

var heapSamples = []string{
	"/gc/heap/allocs:bytes",
	"/gc/heap/live:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
}

// heapState is one reading of the runtime's heap metrics, in bytes.
type heapState struct {
	allocs uint64 // allocated since the start
	live   uint64 // live at the last collection
	excess uint64 // resident heap above live: dead objects, unused and free pages
}

func readHeap(s []metrics.Sample) heapState {
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	h := heapState{allocs: v(0), live: v(1)}
	if resident := v(2) + v(3) + v(4); resident > h.live {
		h.excess = resident - h.live
	}
	return h
}

// shouldRelease reports whether now, allocs bytes after prev, the heap
// holds enough memory above its live heap to return, and allocation has
// been quiet enough since prev that the memory is not about to be reused.
func shouldRelease(prev, now heapState) bool {
	if now.excess < releaseMinExcess || now.excess < now.live/releaseMinShare {
		return false
	}
	return now.allocs-prev.allocs < now.excess/releaseQuietShare
}

// startMemoryRelease checks the heap every quiet period and returns its
// free memory to the OS when shouldRelease says so; stop ends it (and
// waits for it). quiet <= 0 starts nothing.
func startMemoryRelease(quiet time.Duration, log *slog.Logger) (stop func()) {
	if quiet <= 0 {
		return func() {}
	}
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		s := make([]metrics.Sample, len(heapSamples))
		for i, name := range heapSamples {
			s[i].Name = name
		}
		t := time.NewTicker(quiet)
		defer t.Stop()
		prev := readHeap(s)
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			now := readHeap(s)
			if shouldRelease(prev, now) {
				start := time.Now()
				debug.FreeOSMemory()
				after := readHeap(s)
				log.Debug("dlockd: returned idle heap memory to the OS", "excess_bytes", now.excess, "excess_after_bytes", after.excess, "live_bytes", after.live, "took", time.Since(start))
				now = after
			}
			prev = now
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}

// The collector's headroom (--gc-headroom-bytes).
//
// Go collects when the heap has grown, since the last collection, by
// gc-percent of what the collector scans: the live heap, the goroutines'
// stacks and the globals. A lock server's live heap is small when it holds
// few leases (a few MiB), while every request allocates a few KiB that die
// at once: at 20,000 commands a second the collector then runs many times
// a second, and each run costs the same fixed work (every goroutine's
// stack, the globals, the mark phases) whatever the garbage. The headroom
// keeps that growth at least headroom bytes: the heap goal is
// max(live + scanned × gc-percent/100, live + headroom), scanned being the
// live heap, stacks and globals. After every collection (a cleanup on a
// sentinel object runs then) the GC percentage is set to what gives that
// goal for the new figures (gcPercentFor), and to gc-percent itself once
// gc-percent leaves more room than the headroom (about 16 MiB scanned,
// with the defaults: 100,000 held leases are past it). The price is up to
// the headroom in garbage while the server is busy; once it is quiet, the
// heap release above returns it.

// goHeapMinimum is the Go runtime's minimum heap goal at GOGC=100 (4 MiB):
// the runtime scales it with the GC percentage, so a percentage set for a
// small live heap would otherwise have that minimum, not the headroom, set
// the goal (a percentage of 1,100 gives a 44 MiB minimum).
const goHeapMinimum = 4 << 20

// gcPercentFor returns the GC percentage that puts the heap goal at live +
// headroom bytes, the collector scanning scanned bytes (live heap, stacks
// and globals): the goal is max(live + scanned × p/100, goHeapMinimum ×
// p/100), so p is the lesser of headroom×100/scanned and
// (live+headroom)×100/goHeapMinimum. It returns at least base; base when
// headroom is 0 or the live heap unknown (0).
func gcPercentFor(base int, live, scanned, headroom uint64) int {
	if headroom == 0 || live == 0 || base < 0 {
		return base
	}
	scanned = max(scanned, live)
	// In float64: no overflow for any inputs.
	need := min(float64(headroom)*100/float64(scanned), (float64(live)+float64(headroom))*100/goHeapMinimum)
	if need >= math.MaxInt32 {
		return math.MaxInt32
	}
	return max(base, int(need))
}

// gcHeadroom adjusts the GC percentage after each collection.
type gcHeadroom struct {
	base     int    // --gc-percent
	headroom uint64 // bytes
	stopped  atomic.Bool
	sample   []metrics.Sample // live heap, stacks, globals; used by the cleanup goroutine only
	percent  int              // the percentage last set; cleanup goroutine only
}

// startGCHeadroom sets the GC percentage after every collection so that
// the heap goal stays at least headroom bytes above the live heap (see
// gcPercentFor); stop ends it and sets the percentage back to base. A
// headroom of 0 or a negative base (GC off) starts nothing.
func startGCHeadroom(base int, headroom uint64) (stop func()) {
	if headroom == 0 || base < 0 {
		return func() {}
	}
	g := &gcHeadroom{base: base, headroom: headroom, percent: base, sample: []metrics.Sample{
		{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}}
	g.adjust()
	g.arm()
	return func() {
		g.stopped.Store(true)
		debug.SetGCPercent(base)
	}
}

// arm registers a cleanup that runs after the next collection: it adjusts
// the percentage and arms the next one, until stopped.
func (g *gcHeadroom) arm() {
	sentinel := new([16]byte) // a pointer-free object of its own: not a tiny allocation
	runtime.AddCleanup(sentinel, func(g *gcHeadroom) {
		if g.stopped.Load() {
			return
		}
		g.adjust()
		g.arm()
	}, g)
}

// adjust sets the GC percentage for what the last collection found live
// (heap, stacks, globals), when it changed by more than a tenth
// (SetGCPercent recomputes the collector's pacing). Before the first
// collection the live heap is unknown: gc-percent stays.
func (g *gcHeadroom) adjust() {
	metrics.Read(g.sample)
	var v [3]uint64
	for i := range g.sample {
		if g.sample[i].Value.Kind() == metrics.KindUint64 {
			v[i] = g.sample[i].Value.Uint64()
		}
	}
	p := gcPercentFor(g.base, v[0], v[0]+v[1]+v[2], g.headroom)
	if d := p - g.percent; d == 0 || max(d, -d) < g.percent/10 {
		return
	}
	g.percent = p
	debug.SetGCPercent(p)
}
