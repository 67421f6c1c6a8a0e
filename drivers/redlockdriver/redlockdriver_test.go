package redlockdriver_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/redlockdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const nodes = 5

func redlockURL(rs []*testservers.Redis) string {
	var addrs []string
	for _, r := range rs {
		addrs = append(addrs, r.Addr())
	}
	// 200 ms per node: the tests run under -race on two shared cores.
	return "redlock://" + strings.Join(addrs, ",") + "?node_timeout=200ms"
}

func openDriver(t testing.TB, rawURL string) *redlockdriver.Driver {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	d, err := redlockdriver.Open(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// each runs fn on every server in parallel.
func each(rs []*testservers.Redis, fn func(r *testservers.Redis) error) error {
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(r)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func TestConformance(t *testing.T) {
	rs := testservers.StartRedisN(t, nodes)
	freezer := testservers.NewFreezer(t, func() []int {
		var pids []int
		for _, r := range rs {
			pids = append(pids, r.PID())
		}
		return pids
	})
	dlocktest.Run(t, dlocktest.Harness{
		Name: "redlock",
		NewDriver: func(ctx context.Context) (driver.Driver, error) {
			u, err := url.Parse(redlockURL(rs))
			if err != nil {
				return nil, err
			}
			return redlockdriver.Open(ctx, u)
		},
		StopStore:   func() error { return each(rs, (*testservers.Redis).Stop) },
		StartStore:  func() error { return each(rs, (*testservers.Redis).Start) },
		FreezeStore: freezer.Freeze, // every node
		ThawStore:   freezer.Thaw,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			raw := redlockURL(rs)
			for _, r := range rs {
				raw = strings.Replace(raw, r.Addr(), via(r.Addr()), 1)
			}
			u, err := url.Parse(raw)
			if err != nil {
				return nil, err
			}
			return redlockdriver.Open(ctx, u)
		},
		TTL: time.Second,
	})
}

var ownerSeq atomic.Int64

func req(key string, ttl time.Duration) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Owner: fmt.Sprintf("%016x%016x", time.Now().UnixNano(), ownerSeq.Add(1)), TTL: ttl}
}

func client(t *testing.T, r *testservers.Redis) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), DisableIdentity: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// restartEmpty kills a node, deletes its data and starts it again: a node
// that lost everything (no persistence, or a disk replaced).
func restartEmpty(t *testing.T, r *testservers.Redis) {
	t.Helper()
	r.Kill()
	entries, err := os.ReadDir(r.Dir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "redis.log" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(r.Dir(), e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
}

func TestRedlock(t *testing.T) {
	rs := testservers.StartRedisN(t, nodes)
	d := openDriver(t, redlockURL(rs))
	other := openDriver(t, redlockURL(rs))

	t.Run("OneNodeDownStillWorks", func(t *testing.T) {
		ctx := t.Context()
		if err := rs[0].Stop(); err != nil {
			t.Fatal(err)
		}
		defer rs[0].Start()
		r := req("one-down", time.Second)
		g, err := d.TryAcquire(ctx, r)
		if err != nil || g.Fence == 0 {
			t.Fatalf("TryAcquire with one node down = %+v, %v", g, err)
		}
		if _, err := other.TryAcquire(ctx, req("one-down", time.Second)); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("second TryAcquire = %v, want ErrNotAcquired", err)
		}
		if err := d.Renew(ctx, "one-down", r.Owner, time.Second); err != nil {
			t.Fatalf("Renew with one node down = %v", err)
		}
		if err := d.Release(ctx, "one-down", r.Owner); err != nil {
			t.Fatalf("Release with one node down = %v", err)
		}
		if err := d.Release(ctx, "one-down", r.Owner); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("second Release = %v, want ErrLeaseLost", err)
		}
	})

	t.Run("ThreeNodesDownIsUnavailable", func(t *testing.T) {
		ctx := t.Context()
		locker, err := dlock.Open(ctx, redlockURL(rs), dlock.WithOpTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer locker.Close()
		held, err := locker.Acquire(ctx, "three-down", dlock.WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := each(rs[:3], (*testservers.Redis).Stop); err != nil {
			t.Fatal(err)
		}
		defer each(rs[:3], (*testservers.Redis).Start)
		start := time.Now()
		_, err = locker.TryAcquire(ctx, "three-down-2", dlock.WithTTL(time.Second))
		if !errors.Is(err, dlock.ErrUnavailable) {
			t.Fatalf("TryAcquire with 3 of 5 down = %v, want ErrUnavailable", err)
		}
		var qe *redlockdriver.QuorumError
		if !errors.As(err, &qe) || qe.OK != 2 || qe.Quorum != 3 || len(qe.Unwrap()) != 4 {
			t.Fatalf("error %v is not a QuorumError with 2 OK and 3 node errors", err)
		}
		// No retry budget: a waiting Acquire reports the outage at its
		// first store error (by default it retries until its ctx ends).
		_, err = locker.Acquire(ctx, "three-down-2", dlock.WithTTL(time.Second), dlock.WithRetryFor(0))
		if !errors.Is(err, dlock.ErrUnavailable) {
			t.Fatalf("Acquire with 3 of 5 down = %v, want ErrUnavailable", err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("outage reported after %v", took)
		}
		// Losing by the deadline is the root's job (the conformance
		// suite checks its promptness); here: the lease is lost, not kept.
		select {
		case <-held.Done():
		case <-time.After(time.Until(held.Deadline()) + 2*time.Second):
			t.Fatalf("held lease not lost without a majority, %v after its deadline", time.Since(held.Deadline()))
		}
		if !errors.Is(held.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("held.Err = %v", held.Err())
		}
	})

	t.Run("NodeRestartedEmptyIsRepaired", func(t *testing.T) {
		ctx := t.Context()
		r := req("repair", 2*time.Second)
		g, err := d.TryAcquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		restartEmpty(t, rs[0])
		c0 := client(t, rs[0])
		if v, err := c0.Get(ctx, "dlock:redlock:lock:repair").Result(); !errors.Is(err, redis.Nil) {
			t.Fatalf("node 0 not empty after restart: %q, %v", v, err)
		}
		if err := d.Renew(ctx, "repair", r.Owner, 2*time.Second); err != nil {
			t.Fatalf("Renew = %v", err)
		}
		if v, err := c0.Get(ctx, "dlock:redlock:lock:repair").Result(); err != nil || v != r.Owner {
			t.Fatalf("node 0 lock key after renew = %q, %v; want the owner token", v, err)
		}
		if v, err := c0.Get(ctx, d.FenceCounterKey("repair")).Uint64(); err != nil || v != g.Fence {
			t.Fatalf("node 0 fence counter after renew = %d, %v; want %d", v, err, g.Fence)
		}
		if pttl, err := c0.PTTL(ctx, "dlock:redlock:lock:repair").Result(); err != nil || pttl <= 0 || pttl > 2*time.Second {
			t.Fatalf("node 0 PTTL = %v, %v", pttl, err)
		}
		if err := d.Release(ctx, "repair", r.Owner); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("FenceIncreasesAcrossDisjointOutages", func(t *testing.T) {
		ctx := t.Context()
		// Grant 1 sees only nodes 0-2, grant 2 only nodes 2-4: their
		// majorities share node 2 alone, which carries the counter.
		if err := each(rs[3:], (*testservers.Redis).Stop); err != nil {
			t.Fatal(err)
		}
		r1 := req("fence", time.Second)
		g1, err := d.TryAcquire(ctx, r1)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, "fence", r1.Owner); err != nil {
			t.Fatal(err)
		}
		if err := each(rs[3:], (*testservers.Redis).Start); err != nil {
			t.Fatal(err)
		}
		if err := each(rs[:2], (*testservers.Redis).Stop); err != nil {
			t.Fatal(err)
		}
		defer each(rs[:2], (*testservers.Redis).Start)
		r2 := req("fence", time.Second)
		g2, err := other.TryAcquire(ctx, r2)
		if err != nil {
			t.Fatal(err)
		}
		if g2.Fence <= g1.Fence {
			t.Fatalf("fence %d not greater than %d", g2.Fence, g1.Fence)
		}
		// Nodes 3 and 4 had lower counters: the second round wrote the
		// fence to the whole majority.
		for i, n := range rs[2:] {
			if v, err := client(t, n).Get(ctx, d.FenceCounterKey("fence")).Uint64(); err != nil || v != g2.Fence {
				t.Fatalf("node %d fence counter = %d, %v; want %d", i+2, v, err, g2.Fence)
			}
		}
		if err := other.Release(ctx, "fence", r2.Owner); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("RenewReportsPerNodeAndLosesWithoutMajority", func(t *testing.T) {
		ctx := t.Context()
		r := req("renew", 2*time.Second)
		if _, err := d.TryAcquire(ctx, r); err != nil {
			t.Fatal(err)
		}
		// Two nodes taken over by someone else: a majority still holds.
		for _, n := range rs[:2] {
			if err := client(t, n).Set(ctx, "dlock:redlock:lock:renew", "intruder", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.Renew(ctx, "renew", r.Owner, 2*time.Second); err != nil {
			t.Fatalf("Renew with a majority left = %v", err)
		}
		// A third: the majority is gone.
		if err := client(t, rs[2]).Set(ctx, "dlock:redlock:lock:renew", "intruder", 0).Err(); err != nil {
			t.Fatal(err)
		}
		err := d.Renew(ctx, "renew", r.Owner, 2*time.Second)
		if !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew without a majority = %v, want ErrLeaseLost", err)
		}
		var qe *redlockdriver.QuorumError
		if !errors.As(err, &qe) || qe.OK != 2 || len(qe.Nodes) != nodes || qe.Nodes[0] == nil || qe.Nodes[4] != nil {
			t.Fatalf("per-node results missing: %#v", qe)
		}
		// The driver removed what it still held; the intruder is untouched.
		for i, n := range rs {
			v, err := client(t, n).Get(ctx, "dlock:redlock:lock:renew").Result()
			if i < 3 && v != "intruder" || i >= 3 && !errors.Is(err, redis.Nil) {
				t.Fatalf("node %d after the loss: %q, %v", i, v, err)
			}
		}
		if err := d.Release(ctx, "renew", r.Owner); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Release after loss = %v, want ErrLeaseLost", err)
		}
	})

	t.Run("SlowAttemptFailsAndLeavesNothing", func(t *testing.T) {
		ctx := t.Context()
		calls := &scriptCalls{}
		var clients []redis.Scripter
		for _, n := range rs {
			clients = append(clients, lateScripter{Client: client(t, n), delay: 300 * time.Millisecond, first: &atomic.Bool{}, calls: calls})
		}
		slow, err := redlockdriver.New(clients, &redlockdriver.Options{NodeTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		// Every node has the lock script cached (EVALSHA finds it), so
		// the late first call is the lock write itself.
		warm := req("slow", time.Second)
		if _, err := d.TryAcquire(ctx, warm); err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, "slow", warm.Owner); err != nil {
			t.Fatal(err)
		}
		// Budget: half the TTL, 200 ms. The lock writes land on every
		// node after 300 ms, when the attempt has given up, and would
		// hold the key until 700 ms.
		r := req("slow", 400*time.Millisecond)
		_, err = slow.TryAcquire(ctx, r)
		if !errors.Is(err, driver.ErrUnavailable) {
			t.Fatalf("slow TryAcquire = %v, want ErrUnavailable (out of time)", err)
		}
		// Every script call must have come back before leftovers can be
		// seen: a call still in flight may yet write.
		deadline := time.Now().Add(5 * time.Second)
		for calls.inFlight.Load() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d script calls still in flight 5s after the slow attempt failed", calls.inFlight.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
		if n := calls.landed.Load(); n != nodes {
			t.Fatalf("%d late lock writes landed, want %d: the test does not test its point", n, nodes)
		}
		for i, n := range rs {
			if v, err := client(t, n).Get(ctx, "dlock:redlock:lock:slow").Result(); !errors.Is(err, redis.Nil) {
				t.Errorf("node %d holds the key after the failed slow attempt: %q, %v", i, v, err)
			}
		}
		r2 := req("slow", time.Second)
		if _, err := d.TryAcquire(ctx, r2); err != nil {
			t.Fatalf("key left held after a failed slow attempt: %v", err)
		}
		if err := d.Release(ctx, "slow", r2.Owner); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("InvalidNodeCount", func(t *testing.T) {
		u, _ := url.Parse("redlock://" + rs[0].Addr() + "," + rs[1].Addr())
		if _, err := redlockdriver.Open(t.Context(), u); err == nil {
			t.Fatal("Open with 2 nodes succeeded")
		}
	})
}

// lateScripter delivers the first script call made through it late, as a
// slow network would: it sends it after delay whatever the caller's context
// says by then (the request is on its way), so the write lands on the node
// after the caller has given up. Later calls go at once. calls counts them.
type lateScripter struct {
	*redis.Client
	delay time.Duration
	first *atomic.Bool // set once the first call has been made
	calls *scriptCalls
}

// scriptCalls counts the script calls made through lateScripters: not yet
// returned (a returned call's write has landed or never will), and late
// writes that the node carried out.
type scriptCalls struct {
	inFlight, landed atomic.Int64
}

func (s lateScripter) do(ctx context.Context, call func(ctx context.Context) *redis.Cmd) *redis.Cmd {
	s.calls.inFlight.Add(1)
	defer s.calls.inFlight.Add(-1)
	if s.first.Swap(true) {
		return call(ctx)
	}
	time.Sleep(s.delay)
	cmd := call(context.WithoutCancel(ctx))
	if cmd.Err() == nil {
		s.calls.landed.Add(1)
	}
	return cmd
}

func (s lateScripter) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return s.do(ctx, func(ctx context.Context) *redis.Cmd { return s.Client.EvalSha(ctx, sha1, keys, args...) })
}

func (s lateScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return s.do(ctx, func(ctx context.Context) *redis.Cmd { return s.Client.Eval(ctx, script, keys, args...) })
}
