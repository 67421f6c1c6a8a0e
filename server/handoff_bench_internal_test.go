package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// BenchmarkHandoff measures W2's server path without gRPC: n goroutines
// on one key, each in a loop of acquire with wait and release (fsync on);
// handoffs/s is the rate of grants, entries/handoff the log entries written
// per grant (the release's and the previous holder's new queue entry,
// shared when they go in one entry). With claim=before, a handed-over grant
// is claimed (a renewal) before it is released, as the dlockd driver's Wait
// does for a caller that does not confirm grants itself; with claim=none it
// is released unclaimed, as the dlock library's W2 leases are (the claim is
// a lease's first renewal, due a few milliseconds after the grant).
func BenchmarkHandoff(b *testing.B) {
	for _, c := range []struct {
		n     int
		claim bool
		name  string
	}{{8, true, "before"}, {8, false, "none"}, {64, true, "before"}, {64, false, "none"}} {
		n := c.n
		b.Run(fmt.Sprintf("waiters=%d/claim=%s", n, c.name), func(b *testing.B) {
			s := startBenchServer(b)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			var mu sync.Mutex
			grants := 0
			b.ResetTimer()
			start, index0 := time.Now(), s.raft.LastIndex()
			var wg sync.WaitGroup
			for w := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						mu.Lock()
						if grants >= b.N {
							mu.Unlock()
							return
						}
						mu.Unlock()
						owner := fmt.Sprintf("owner-%d-%d-0123456789", w, i)
						out, err := s.acquire(ctx, acquireIn{key: "bench/handoff", owner: owner, ttl: time.Minute, wait: true}, nil, nil)
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						grants++
						mu.Unlock()
						if c.claim && out.claimWithin > 0 {
							if ok, err := s.renew([]renewIn{{key: out.key, owner: owner, ttl: time.Minute}}); err != nil || !ok[0] {
								b.Errorf("claim: %v %v", ok, err)
								return
							}
						}
						if _, err := s.release(out.key, owner); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(grants)/time.Since(start).Seconds(), "handoffs/s")
			b.ReportMetric(float64(s.raft.LastIndex()-index0)/float64(grants), "entries/handoff")
		})
	}
}
