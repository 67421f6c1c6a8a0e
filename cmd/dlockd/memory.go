package main

// memory.go returns to the OS the heap memory a burst of allocation left
// behind (--release-memory-after).
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
	"runtime/debug"
	"runtime/metrics"
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
