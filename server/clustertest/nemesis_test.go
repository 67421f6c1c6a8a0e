package clustertest

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/server/servertest"
)

var nemesisDuration = flag.Duration("nemesis.duration", 0,
	"how long TestNemesis injects faults (default: $DLOCK_NEMESIS_DURATION, else 60s)")

// defaultNemesis is the length of the nemesis run in `make test` (CI) and
// `make nemesis`: a few dozen faults. DLOCK_NEMESIS_DURATION=10m is the
// long run.
const defaultNemesis = 60 * time.Second

func nemesisLength(t *testing.T) time.Duration {
	t.Helper()
	if *nemesisDuration > 0 {
		return *nemesisDuration
	}
	if s := os.Getenv("DLOCK_NEMESIS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("DLOCK_NEMESIS_DURATION=%q: want a positive duration", s)
		}
		return d
	}
	return defaultNemesis
}

func nemesisSeed(t *testing.T) uint64 {
	t.Helper()
	if s := os.Getenv("DLOCK_NEMESIS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DLOCK_NEMESIS_SEED=%q: %v", s, err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// nemesis injects one fault at a time into a 3-node cluster and undoes it.
type nemesis struct {
	t      *testing.T
	w      *world
	rng    *rand.Rand
	mu     sync.Mutex
	counts map[string]int
}

func (n *nemesis) count(kind string) {
	n.mu.Lock()
	n.counts[kind]++
	n.mu.Unlock()
}

func (n *nemesis) pause(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(n.rng.Int64N(int64(hi-lo)+1))
}

// leader returns the current leader, or a random node when none is known.
func (n *nemesis) leader() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if l, err := n.w.c.Leader(ctx); err == nil {
		return l
	}
	return n.rng.IntN(n.w.c.N())
}

// one injects a random fault, holds it for a while, and undoes it.
func (n *nemesis) one() {
	c := n.w.c
	N := c.N()
	hold := n.pause(300*time.Millisecond, 2500*time.Millisecond)
	switch k := n.rng.IntN(8); k {
	case 0: // a random split: one node alone against the others
		i := n.rng.IntN(N)
		n.count("partition")
		n.t.Logf("nemesis: partition %s | rest for %v", c.Node(i).ID, hold)
		c.Isolate(i)
		time.Sleep(hold)
		c.Heal()
	case 1: // the leader alone
		l := n.leader()
		n.count("isolate-leader")
		n.t.Logf("nemesis: isolate leader %s for %v", c.Node(l).ID, hold)
		c.Isolate(l)
		time.Sleep(hold)
		c.Heal()
	case 2: // every node alone: no quorum anywhere
		n.count("partition-all")
		hold = min(hold, time.Second)
		n.t.Logf("nemesis: every node alone for %v", hold)
		c.Partition([]int{0}, []int{1}, []int{2})
		time.Sleep(hold)
		c.Heal()
	case 3: // SIGSTOP a node, often the leader
		i := n.rng.IntN(N)
		if n.rng.IntN(2) == 0 {
			i = n.leader()
		}
		n.count("pause")
		n.t.Logf("nemesis: pause %s for %v", c.Node(i).ID, hold)
		if err := c.Pause(i); err == nil {
			time.Sleep(hold)
			_ = c.Resume(i)
		}
	case 4: // kill -9 a node, often the leader, and start it again
		i := n.rng.IntN(N)
		if n.rng.IntN(2) == 0 {
			i = n.leader()
		}
		n.count("kill")
		n.t.Logf("nemesis: kill -9 %s, restart after %v", c.Node(i).ID, hold)
		_ = c.Kill(i)
		time.Sleep(hold)
		if err := c.Restart(i); err != nil {
			n.t.Errorf("nemesis: restart %s: %v", c.Node(i).ID, err)
		}
	case 5: // leadership transfer
		n.count("transfer-leader")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err := c.TransferLeader(ctx, -1)
		cancel()
		n.t.Logf("nemesis: transfer leadership: %v", err)
	case 6: // slow links
		n.count("delay")
		n.t.Logf("nemesis: delay node links 5-60ms for %v", hold)
		c.DelayLinks(5*time.Millisecond, 60*time.Millisecond)
		time.Sleep(hold)
		c.DelayLinks(0, 0)
	case 7: // the clients' links to one node cut
		i := n.rng.IntN(N)
		n.count("cut-clients")
		n.t.Logf("nemesis: hold client links to %s for %v", c.Node(i).ID, hold)
		c.Node(i).API.Hold()
		c.Node(i).API.Cut()
		time.Sleep(hold)
		c.Node(i).API.Cut()
		c.Node(i).API.Release()
	}
}

// TestNemesis runs random faults (partitions, an isolated leader, no
// quorum at all, SIGSTOP, kill -9 and restart, leader transfers, slow
// links, cut client links) on a 3-node cluster for the nemesis duration,
// while 8 clients acquire keys (4 keys, waiting), hold them with renewals
// (TTL 1s or 2s) for up to 600ms, write their fence to a fenced register
// every 20ms while their lease is valid by their own clock, and release
// them. Then it checks:
//
//   - historytest.Check: no grant of a key while another client could still
//     believe its grant valid; fences strictly increase;
//   - the register refused no write made within its writer's validity
//     (such a refusal means a greater fence was granted while the writer
//     was valid).
//
// It logs the counts: operations, grants, register writes, faults.
func TestNemesis(t *testing.T) {
	dur := nemesisLength(t)
	seed := nemesisSeed(t)
	t.Logf("nemesis: %v, seed %d (DLOCK_NEMESIS_SEED replays the choices, not the timings)", dur, seed)
	w := newWorld(t, 3, servertest.ClusterOptions{})
	c := w.c
	w.leader(20 * time.Second)
	reg := NewRegister()
	keys := []string{"nem-a", "nem-b", "nem-c", "nem-d"}

	var (
		acquired, acqErrs, lost atomic.Int64
		staleValid              atomic.Int64
		staleMu                 sync.Mutex
		staleWhy                []string
		workers                 sync.WaitGroup
	)
	base, stop := context.WithCancel(context.Background())
	defer stop()
	for i := 0; i < 8; i++ {
		ttl := time.Second * time.Duration(1+i%2)
		l, _ := w.client("", dlock.WithTTL(ttl), dlock.WithOpTimeout(time.Second))
		rng := rand.New(rand.NewPCG(seed, uint64(i)+1))
		workers.Add(1)
		go func() {
			defer workers.Done()
			for base.Err() == nil {
				key := keys[rng.IntN(len(keys))]
				actx, cancel := context.WithTimeout(base, 3*time.Second)
				ls, err := l.Acquire(actx, key)
				cancel()
				if err != nil {
					acqErrs.Add(1)
					continue
				}
				acquired.Add(1)
				holdFor := time.Duration(rng.Int64N(int64(600 * time.Millisecond)))
				end := time.Now().Add(holdFor)
				for time.Now().Before(end) && base.Err() == nil {
					if ls.Context().Err() != nil {
						lost.Add(1)
						break
					}
					dl := ls.Deadline()
					if !time.Now().Before(dl) {
						break
					}
					if err := reg.Write(key, ls.Fence()); err != nil && time.Now().Before(dl) {
						staleValid.Add(1)
						staleMu.Lock()
						staleWhy = append(staleWhy, fmt.Sprintf("%v (writer valid for %v more)", err, time.Until(dl).Round(time.Millisecond)))
						staleMu.Unlock()
					}
					time.Sleep(20 * time.Millisecond)
				}
				rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = ls.Release(rctx)
				rcancel()
			}
		}()
	}

	n := &nemesis{t: t, w: w, rng: rand.New(rand.NewPCG(seed, 0)), counts: map[string]int{}}
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) {
		n.one()
		// Let the cluster recover before the next fault.
		time.Sleep(n.pause(300*time.Millisecond, 1500*time.Millisecond))
	}
	// Undo everything and let the clients finish.
	c.Heal()
	for i := 0; i < c.N(); i++ {
		if c.Node(i).Paused() {
			_ = c.Resume(i)
		}
		if c.Node(i).PID() == 0 {
			if err := c.Restart(i); err != nil {
				t.Errorf("restart %s: %v", c.Node(i).ID, err)
			}
		}
	}
	healedAt := time.Now()
	w.leader(20 * time.Second)
	before := acquired.Load()
	settle := time.Now().Add(10 * time.Second)
	for acquired.Load() < before+5 && time.Now().Before(settle) {
		time.Sleep(50 * time.Millisecond)
	}
	if acquired.Load() < before+5 {
		t.Errorf("clients made no progress after the faults ended (%d grants in 10s)", acquired.Load()-before)
	}
	t.Logf("nemesis: faults ended; leader and %d grants %v after healing", acquired.Load()-before, time.Since(healedAt).Round(time.Millisecond))
	stop()
	workers.Wait()
	t.Logf("nemesis: clients stopped %v after healing", time.Since(healedAt).Round(time.Millisecond))

	rep := w.check()
	acc, ref := reg.Counts()
	kinds := make([]string, 0, len(n.counts))
	total := 0
	for k, v := range n.counts {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, v))
		total += v
	}
	slices.Sort(kinds)
	t.Logf("nemesis: %d faults (%s); clients: %d grants, %d acquisitions failed, %d leases lost while held; "+
		"register: %d writes accepted, %d refused, %d refused within the writer's validity; history: %d ops, %d grants, %d violations",
		total, strings.Join(kinds, ", "), acquired.Load(), acqErrs.Load(), lost.Load(),
		acc, ref, staleValid.Load(), rep.Stats.Ops, rep.Stats.Grants, len(rep.Violations))
	if staleValid.Load() > 0 {
		staleMu.Lock()
		t.Errorf("the fenced register refused %d writes made within the writer's validity:\n%s", staleValid.Load(), strings.Join(staleWhy, "\n"))
		staleMu.Unlock()
	}
	if acquired.Load() == 0 {
		t.Errorf("no grant in the whole run")
	}
}
