package historytest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dlock-dev/dlock/internal/netproxy"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server/servertest"
)

// The tests run a real dlockd with fsync on (the default, NoSync false):
// the window between a renewal's check of the countdown and the commit of
// its log entry, where the races under test live, is then as wide as in
// production (one fsync), not the microseconds of a write to the page
// cache.

// callTimeout bounds every call of the tests.
const callTimeout = 3 * time.Second

// startServer starts an embedded dlockd with fsync on.
func startServer(t *testing.T) *servertest.Embedded {
	t.Helper()
	cfg := servertest.Config(t, t.TempDir())
	cfg.NoSync = false
	return servertest.StartEmbedded(t, cfg)
}

// dial opens one gRPC connection (one TCP connection) to addr, closed when
// the test ends.
func dial(t *testing.T, addr string) dlockv1.LockClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return dlockv1.NewLockClient(cc)
}

// seed returns the seed of the random choices: DLOCK_HISTORY_SEED, or a
// new one. It is logged so that a failing run's choices can be replayed
// (its timings cannot).
func seed(t *testing.T) uint64 {
	t.Helper()
	if s := os.Getenv("DLOCK_HISTORY_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DLOCK_HISTORY_SEED=%q: %v", s, err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

// outcome classifies a call's error. A definite refusal is Failed; an
// error that may hide a success (timeout, cancellation, broken connection)
// is Unknown.
func outcome(err error) Outcome {
	if err == nil {
		return OK
	}
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.NotFound, codes.ResourceExhausted, codes.AlreadyExists, codes.InvalidArgument:
		return Failed
	}
	return Unknown
}

// errNote is the note recorded for an error.
func errNote(err error) string {
	if err == nil {
		return ""
	}
	if s, ok := status.FromError(err); ok {
		return s.Code().String() + ": " + s.Message()
	}
	return err.Error()
}

// caller makes recorded calls for one client.
type caller struct {
	t      *testing.T
	id     int
	rec    *Recorder
	conns  []dlockv1.LockClient
	rng    *rand.Rand // used by the client's goroutine only
	badArg *atomic.Int64
}

func (c *caller) conn() dlockv1.LockClient { return c.conns[c.rng.IntN(len(c.conns))] }

// checkArg reports an INVALID_ARGUMENT answer to a request the test meant
// to be valid: a bug of the test, or of the server's validation.
func (c *caller) checkArg(what string, err error) {
	if status.Code(err) == codes.InvalidArgument {
		c.badArg.Add(1)
		c.t.Errorf("client %d: %s: %v", c.id, what, err)
	}
}

// grant is an acknowledged grant, as the client saw it.
type grant struct {
	fence       uint64
	ttl, claim  time.Duration
	invoke, end time.Duration // end: validity end (see the package doc)
}

func grantOf(op Op) grant {
	return grant{fence: op.Fence, ttl: op.GrantTTL, claim: op.ClaimWithin, invoke: op.Invoke, end: validityOf(&op, 0)}
}

// acquire calls Acquire on cl and records it.
// The error is the call's, for callers that tell refusals apart.
func (c *caller) acquire(ctx context.Context, cl dlockv1.LockClient, key, owner string, ttl time.Duration, wait bool, timeout time.Duration, note string) (Op, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	op := Op{Client: c.id, Kind: Acquire, Key: key, Owner: owner, TTL: ttl, Note: note}
	op.Invoke = c.rec.Now()
	resp, err := cl.Acquire(ctx, &dlockv1.AcquireRequest{Key: key, Owner: owner, Ttl: durationpb.New(ttl), Wait: wait})
	op.Complete = c.rec.Now()
	op.Outcome = outcome(err)
	if err != nil {
		op.Note = join(note, errNote(err))
	} else {
		op.Fence = resp.GetFence()
		op.GrantTTL = resp.GetTtl().AsDuration()
		op.ClaimWithin = resp.GetClaimWithin().AsDuration()
	}
	op.ID = c.rec.Add(op)
	return op, err
}

// renew renews one grant on cl and records it.
func (c *caller) renew(ctx context.Context, cl dlockv1.LockClient, key, owner string, ttl time.Duration, note string) Op {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	op := Op{Client: c.id, Kind: Renew, Key: key, Owner: owner, TTL: ttl, Note: note}
	op.Invoke = c.rec.Now()
	resp, err := cl.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: key, Owner: owner, Ttl: durationpb.New(ttl)}}})
	op.Complete = c.rec.Now()
	switch {
	case err != nil:
		c.checkArg("renew", err)
		op.Outcome, op.Note = Unknown, join(note, errNote(err))
	case len(resp.GetResults()) != 1:
		c.t.Errorf("client %d: renew %q: %d results for 1 item", c.id, key, len(resp.GetResults()))
		op.Outcome = Unknown
	case resp.GetResults()[0].GetOk():
		op.Outcome = OK
	default:
		op.Outcome, op.Note = Failed, join(note, resp.GetResults()[0].GetReason())
	}
	op.ID = c.rec.Add(op)
	return op
}

// release releases a grant on cl and records it.
func (c *caller) release(ctx context.Context, cl dlockv1.LockClient, key, owner string) Op {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	op := Op{Client: c.id, Kind: Release, Key: key, Owner: owner}
	op.Invoke = c.rec.Now()
	_, err := cl.Release(ctx, &dlockv1.ReleaseRequest{Key: key, Owner: owner})
	op.Complete = c.rec.Now()
	c.checkArg("release", err)
	op.Outcome, op.Note = outcome(err), errNote(err)
	op.ID = c.rec.Add(op)
	return op
}

// cancelWait calls CancelWait on cl and records it.
func (c *caller) cancelWait(ctx context.Context, cl dlockv1.LockClient, key, owner string) Op {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	op := Op{Client: c.id, Kind: CancelWait, Key: key, Owner: owner}
	op.Invoke = c.rec.Now()
	resp, err := cl.CancelWait(ctx, &dlockv1.CancelWaitRequest{Key: key, Owner: owner})
	op.Complete = c.rec.Now()
	c.checkArg("cancel wait", err)
	op.Outcome, op.Note = outcome(err), errNote(err)
	if err == nil {
		op.Note = fmt.Sprintf("dequeued=%v released=%v", resp.GetDequeued(), resp.GetReleased())
	}
	op.ID = c.rec.Add(op)
	return op
}

func join(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// waitEvent is one event of a Wait stream and when it arrived.
type waitEvent struct {
	ev  *dlockv1.WaitEvent
	err error
	at  time.Duration
}

// waitStream is an open Wait stream whose events a goroutine reads.
type waitStream struct {
	c      *caller
	op     Op // Invoke, Key, Owner, TTL set
	stream dlockv1.Lock_WaitClient
	cancel context.CancelFunc
	events chan waitEvent // buffered; closed when the reader ends
}

// startWait opens a Wait stream on cl and sends the request; the stream
// ends at the latest after limit.
func (c *caller) startWait(ctx context.Context, cl dlockv1.LockClient, key, owner string, ttl, limit time.Duration) (*waitStream, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	w := &waitStream{c: c, cancel: cancel, events: make(chan waitEvent, 4)}
	w.op = Op{Client: c.id, Kind: Acquire, Key: key, Owner: owner, TTL: ttl, Note: "wait stream"}
	w.op.Invoke = c.rec.Now()
	s, err := cl.Wait(ctx)
	if err == nil {
		err = s.Send(&dlockv1.AcquireRequest{Key: key, Owner: owner, Ttl: durationpb.New(ttl), Wait: true})
	}
	if err != nil {
		cancel()
		return nil, err
	}
	w.stream = s
	go func() {
		defer close(w.events)
		for {
			ev, err := s.Recv()
			w.events <- waitEvent{ev: ev, err: err, at: c.rec.Now()}
			if err != nil || ev.GetType() != dlockv1.WaitEvent_QUEUED {
				return
			}
		}
	}()
	return w, nil
}

// next returns the stream's next event, or ok false when none came before
// the timer (nil: no timer) fired.
func (w *waitStream) next(timeout <-chan time.Time) (waitEvent, bool) {
	select {
	case e, ok := <-w.events:
		if !ok {
			return waitEvent{err: errors.New("stream already ended")}, true
		}
		return e, true
	case <-timeout:
		return waitEvent{}, false
	}
}

// finish records the stream's final event (GRANTED, CANCELLED or an error)
// and returns the op.
func (w *waitStream) finish(e waitEvent) Op {
	op := w.op
	op.Complete = e.at
	switch {
	case e.err != nil:
		w.c.checkArg("wait", e.err)
		op.Outcome, op.Note = outcome(e.err), join(op.Note, errNote(e.err))
	case e.ev.GetType() == dlockv1.WaitEvent_GRANTED:
		g := e.ev.GetGrant()
		op.Outcome, op.Fence, op.GrantTTL, op.ClaimWithin = OK, g.GetFence(), g.GetTtl().AsDuration(), g.GetClaimWithin().AsDuration()
	case e.ev.GetType() == dlockv1.WaitEvent_CANCELLED:
		op.Outcome, op.Note = Failed, join(op.Note, "cancelled")
	default:
		op.Outcome, op.Note = Unknown, join(op.Note, "unexpected event "+e.ev.GetType().String())
	}
	if op.Complete < op.Invoke {
		op.Complete = w.c.rec.Now()
	}
	op.ID = w.c.rec.Add(op)
	return op
}

// close ends the stream and waits for its reader.
func (w *waitStream) close() {
	w.cancel()
	for range w.events {
	}
}

// until waits until the recorder's clock reads at, or ctx ends. It is the
// workload's schedule (send a renewal at this moment), not a wait for a
// condition.
func until(ctx context.Context, rec *Recorder, at time.Duration) {
	d := at - rec.Now()
	if d <= 0 {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}

// workCounts counts what the workload did beyond what the checker sees.
type workCounts struct {
	waitStreams, streamCancels, unaryWaits, cancelWaits, overlapped, retries, abandoned, newFenceOnRetry atomic.Int64
}

// historyDuration is the random history's length: DLOCK_HISTORY_DURATION,
// or 15s (5s with -short).
func historyDuration(t *testing.T) time.Duration {
	t.Helper()
	if s := os.Getenv("DLOCK_HISTORY_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("DLOCK_HISTORY_DURATION=%q: want a positive duration such as 10m", s)
		}
		return d
	}
	if testing.Short() {
		return 5 * time.Second
	}
	return 15 * time.Second
}

// TestHistory_RandomLeasesNeverTakenEarly runs 8 clients against a real
// dlockd through a proxy that delays every chunk by 0-10 ms each way, each
// client on 3 connections so that its calls overtake each other, on 3 keys
// with TTLs of 100-400 ms renewed near their expiry, and checks the whole
// history with Check. Longer (go test's own -timeout must cover it):
//
//	DLOCK_HISTORY_DURATION=10m go test -race -timeout 20m -run TestHistory_Random ./server/historytest/
func TestHistory_RandomLeasesNeverTakenEarly(t *testing.T) {
	const (
		clients        = 8
		connsPerClient = 3
		maxIterations  = 1_000_000
	)
	keys := []string{"hist/a", "hist/b", "hist/c"}
	dur := historyDuration(t)
	sd := seed(t)
	srv := startServer(t)
	proxy := netproxy.Start(t, srv.Addr(), sd)
	proxy.SetDelay(netproxy.Upstream, 0, 10*time.Millisecond)
	proxy.SetDelay(netproxy.Downstream, 0, 10*time.Millisecond)
	t.Logf("seed %d (DLOCK_HISTORY_SEED), %v of history (DLOCK_HISTORY_DURATION), fsync on; %s", sd, dur, proxy)

	rec := NewRecorder()
	var counts workCounts
	var badArg atomic.Int64
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for i := range clients {
		c := &caller{t: t, id: i, rec: rec, rng: rand.New(rand.NewPCG(sd, uint64(i))), badArg: &badArg}
		for range connsPerClient {
			c.conns = append(c.conns, dial(t, proxy.Addr()))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < maxIterations && time.Now().Before(deadline) && ctx.Err() == nil && badArg.Load() == 0; n++ {
				c.iteration(ctx, keys, n, &counts)
			}
		}()
	}
	wg.Wait()

	ops := rec.Ops()
	rep, err := Check(ops)
	if err != nil {
		t.Fatal(err)
	}
	ps := proxy.Stats()
	t.Logf("history: %s", rep.Stats.Summary())
	t.Logf("workload: %d wait streams (%d cancelled by half-close), %d unary waits, %d CancelWait calls, %d overlapping calls, %d retried acquires (%d answered with a new fence), %d grants left to expire",
		counts.waitStreams.Load(), counts.streamCancels.Load(), counts.unaryWaits.Load(), counts.cancelWaits.Load(),
		counts.overlapped.Load(), counts.retries.Load(), counts.newFenceOnRetry.Load(), counts.abandoned.Load())
	t.Logf("proxy: %d connections, %d chunks up, %d chunks down", ps.Conns, ps.Chunks[netproxy.Upstream], ps.Chunks[netproxy.Downstream])
	t.Logf("violations: %d%s", len(rep.Violations), byCause(ops, rep.Violations))
	if err := rep.Err(20); err != nil {
		t.Error(err)
		logHolders(t, ops, rep.Violations, 10)
	}
	// A history that exercised nothing proves nothing.
	if rep.Stats.Grants < 20 || rep.Stats.Successions < 10 || rep.Stats.RenewOK < 10 || rep.Stats.NearExpiry < 1 {
		t.Errorf("the workload exercised too little to judge the server: %s", rep.Stats.Summary())
	}
}

// logHolders logs, for the first max early grants, every operation of the
// holder's owner on the key: what the client did and was told.
func logHolders(t *testing.T, ops []Op, vs []Violation, max int) {
	t.Helper()
	for i, v := range vs {
		if i == max {
			break
		}
		if v.Kind != EarlyGrant {
			continue
		}
		s := fmt.Sprintf("violation %d: the holder's operations on %q (fence %d, valid until %s; other grant received %s):", i+1, v.Key, v.A.Fence, ms(v.ValidUntil), ms(v.B.Complete))
		for _, op := range ops {
			if op.Key == v.Key && op.Owner == v.A.Owner {
				s += "\n\t" + op.String()
			}
		}
		t.Log(s)
	}
}

// byCause sorts early grants by what set the holder's validity end, as
// " (retried acquire: 3, renewal with a new TTL: 1)".
func byCause(ops []Op, vs []Violation) string {
	counts := map[string]int{}
	var order []string
	for _, v := range vs {
		what := string(v.Kind)
		if v.Kind == EarlyGrant {
			switch {
			case shortened(ops, v):
				what = "a later renewal or retry by the holder with a shorter TTL (the server shortened the countdown)"
			case v.Cause.ID == v.A.ID:
				what = "the grant itself"
			case v.Cause.Kind == Acquire:
				what = "retried acquire"
			case strings.Contains(v.Cause.Note, "new TTL"):
				what = "renewal with a new TTL"
			default:
				what = "renewal with the same TTL"
			}
			what = "early grant after " + what
		}
		if counts[what] == 0 {
			order = append(order, what)
		}
		counts[what]++
	}
	if len(order) == 0 {
		return ""
	}
	parts := make([]string, len(order))
	for i, w := range order {
		parts[i] = fmt.Sprintf("%s: %d", w, counts[w])
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// shortened says whether the holder had a renewal or a retried acquire
// acknowledged whose own end was earlier than its validity end, sent before
// the other grant was received and not answered before the operation that
// set the validity end was sent (later, or overlapping): a server that
// moves its countdown to that end takes the grant early.
func shortened(ops []Op, v Violation) bool {
	for i := range ops {
		op := &ops[i]
		if op.Key != v.Key || op.Owner != v.A.Owner || op.Outcome != OK || op == &v.Cause || op.Complete <= v.Cause.Invoke || op.Invoke >= v.B.Complete {
			continue
		}
		if (op.Kind == Renew || op.Kind == Acquire && op.Fence == v.A.Fence) && validityOf(op, op.TTL) < v.ValidUntil {
			return true
		}
	}
	return false
}

// newOwner returns a fresh owner token (printable ASCII, unique in the
// history).
func (c *caller) newOwner(n int) string {
	return fmt.Sprintf("c%d-%d-%016x", c.id, n, c.rng.Uint64())
}

// randTTL returns a TTL in [100ms, 400ms] in whole milliseconds.
func (c *caller) randTTL() time.Duration {
	return time.Duration(100+c.rng.IntN(301)) * time.Millisecond
}

// iteration acquires one key by one of three methods, holds it with
// renewals near its expiry, and releases it or lets it expire.
func (c *caller) iteration(ctx context.Context, keys []string, n int, counts *workCounts) {
	key := keys[c.rng.IntN(len(keys))]
	owner := c.newOwner(n)
	ttl := c.randTTL()
	var op Op
	switch r := c.rng.IntN(100); {
	case r < 30: // try once
		var err error
		op, err = c.acquire(ctx, c.conn(), key, owner, ttl, false, callTimeout, "try")
		c.checkArg("acquire", err)
		if op.Outcome == Failed {
			until(ctx, c.rec, c.rec.Now()+time.Duration(c.rng.IntN(20))*time.Millisecond)
		}
	case r < 50: // unary wait, given up after 50-600 ms
		counts.unaryWaits.Add(1)
		limit := time.Duration(50+c.rng.IntN(551)) * time.Millisecond
		var err error
		op, err = c.acquire(ctx, c.conn(), key, owner, ttl, true, limit, "unary wait")
		c.checkArg("acquire with wait", err)
		if op.Outcome == Unknown && c.rng.IntN(2) == 0 {
			counts.cancelWaits.Add(1)
			c.cancelWait(ctx, c.conn(), key, owner)
		}
	default: // Wait stream, half-closed after 50-800 ms or kept
		counts.waitStreams.Add(1)
		w, err := c.startWait(ctx, c.conn(), key, owner, ttl, callTimeout)
		if err != nil {
			c.t.Errorf("client %d: wait stream: %v", c.id, err)
			return
		}
		var timer <-chan time.Time
		if c.rng.IntN(10) < 7 {
			tm := time.NewTimer(time.Duration(50+c.rng.IntN(751)) * time.Millisecond)
			defer tm.Stop()
			timer = tm.C
		}
		for {
			e, ok := w.next(timer)
			if !ok { // give up: half-close; GRANTED may still win the race
				counts.streamCancels.Add(1)
				timer = nil
				_ = w.stream.CloseSend()
				continue
			}
			if e.err == nil && e.ev.GetType() == dlockv1.WaitEvent_QUEUED {
				continue
			}
			op = w.finish(e)
			break
		}
		w.close()
		if op.Outcome == Unknown {
			counts.cancelWaits.Add(1)
			c.cancelWait(ctx, c.conn(), key, owner)
		}
	}
	if op.Outcome != OK {
		return
	}
	c.hold(ctx, key, owner, grantOf(op), counts)
}

// hold renews the grant 0-3 times, mostly within 15 ms of its validity end
// (some a few ms after it), with the same TTL, a new TTL, or a retried
// Acquire with a new TTL, sometimes with a second renewal overlapping on
// another connection; then releases it (70%) or lets it expire.
func (c *caller) hold(ctx context.Context, key, owner string, g grant, counts *workCounts) {
	var overlap sync.WaitGroup
	defer overlap.Wait()
	end, ttl := g.end, g.ttl
	for left := c.rng.IntN(4); left > 0 && ctx.Err() == nil; left-- {
		var at time.Duration
		switch {
		case g.claim > 0 && left > 0: // a handed-over grant: claim it now
			at = c.rec.Now()
			g.claim = 0
		case c.rng.IntN(10) < 7: // near expiry: from 15 ms before to 3 ms after
			at = end - time.Duration(c.rng.IntN(18_000)-3_000)*time.Microsecond
		default:
			at = end - ttl/2 + time.Duration(c.rng.Int64N(int64(ttl/4)))
		}
		until(ctx, c.rec, at)
		if c.rng.IntN(5) == 0 { // a second renewal on another connection, 0-3 ms later
			counts.overlapped.Add(1)
			cl := c.conn()
			lag := time.Duration(c.rng.IntN(3000)) * time.Microsecond
			rttl := ttl
			overlap.Add(1)
			go func() {
				defer overlap.Done()
				until(ctx, c.rec, c.rec.Now()+lag)
				c.renew(ctx, cl, key, owner, rttl, "overlapping")
			}()
		}
		var op Op
		newTTL := ttl
		switch r := c.rng.IntN(100); {
		case r < 55:
			op = c.renew(ctx, c.conn(), key, owner, ttl, "")
		case r < 80:
			newTTL = c.randTTL()
			op = c.renew(ctx, c.conn(), key, owner, newTTL, "new TTL")
		default:
			counts.retries.Add(1)
			newTTL = c.randTTL()
			// A refusal of the new TTL (INVALID_ARGUMENT or
			// FAILED_PRECONDITION) is a valid answer: ours stands.
			op, _ = c.acquire(ctx, c.conn(), key, owner, newTTL, false, callTimeout, "retry by the owner")
			if op.Outcome == Failed {
				op.Outcome = Unknown // not a loss: keep renewing
			}
			if op.Outcome == OK && op.Fence != g.fence {
				// Our grant had ended and the retry made a new one:
				// give it back and stop.
				counts.newFenceOnRetry.Add(1)
				c.release(ctx, c.conn(), key, owner)
				return
			}
			if op.Outcome == OK {
				newTTL = op.GrantTTL
			}
		}
		switch op.Outcome {
		case OK:
			end = max(end, op.Invoke+newTTL-Drift(newTTL))
			ttl = newTTL
		case Failed:
			return // lost
		default:
			ttl = min(ttl, newTTL)
		}
		if c.rec.Now() >= end {
			return // lost by our own reckoning: a real client stops here
		}
	}
	if c.rng.IntN(10) < 3 {
		counts.abandoned.Add(1)
		return
	}
	c.release(ctx, c.conn(), key, owner)
}

// TestHistory_RenewWithNewTTLNearExpiry: A holds a key with a 100 ms TTL
// and B waits for it; just before A's validity ends (0-5 ms before), A
// renews with a 2 s TTL over a link that adds 5 ms to the request. The
// renewal may be answered lost, but once it is answered OK, B must not be
// granted before A's new validity end (the renewal's send time + 2 s −
// drift). A renewal that changes the TTL goes through the log; the race is
// the countdown running out between the renewal's check and its commit.
func TestHistory_RenewWithNewTTLNearExpiry(t *testing.T) {
	const (
		attempts = 30
		ttl      = 100 * time.Millisecond
		newTTL   = 2 * time.Second
		oneWay   = 5 * time.Millisecond
	)
	sd := seed(t)
	srv := startServer(t)
	pa := netproxy.Start(t, srv.Addr(), sd) // A's link
	pb := netproxy.Start(t, srv.Addr(), sd) // B's link, no delay
	rec := NewRecorder()
	var badArg atomic.Int64
	ca := &caller{t: t, id: 1, rec: rec, conns: []dlockv1.LockClient{dial(t, pa.Addr())}, rng: rand.New(rand.NewPCG(sd, 1)), badArg: &badArg}
	cb := &caller{t: t, id: 2, rec: rec, conns: []dlockv1.LockClient{dial(t, pb.Addr())}, rng: rand.New(rand.NewPCG(sd, 2)), badArg: &badArg}
	ctx := t.Context()
	var acked, lost, unknown, early int
	for i := range attempts {
		key := fmt.Sprintf("renew-race/%d", i)
		ownerA, ownerB := ca.newOwner(i), cb.newOwner(i)
		pa.SetDelay(netproxy.Upstream, 0, 0)
		ga, _ := ca.acquire(ctx, ca.conns[0], key, ownerA, ttl, false, callTimeout, "A")
		if ga.Outcome != OK {
			t.Fatalf("attempt %d: A's acquire of a free key: %s", i, &ga)
		}
		w, err := cb.startWait(ctx, cb.conns[0], key, ownerB, 10*time.Second, 10*time.Second)
		if err != nil {
			t.Fatalf("attempt %d: B's wait: %v", i, err)
		}
		if e, _ := w.next(nil); e.err != nil || e.ev.GetType() != dlockv1.WaitEvent_QUEUED {
			w.close()
			t.Fatalf("attempt %d: B's wait: want QUEUED first, got %v %v (A's grant must still be valid: %s)", i, e.ev, e.err, &ga)
		}
		pa.SetDelay(netproxy.Upstream, oneWay, oneWay)
		before := time.Duration(i%6) * time.Millisecond
		until(ctx, rec, validityOf(&ga, 0)-before)
		r := ca.renew(ctx, ca.conns[0], key, ownerA, newTTL, fmt.Sprintf("%v before the validity end", before))
		aEnd := r.Invoke + newTTL - Drift(newTTL)
		switch r.Outcome {
		case OK:
			acked++
			// B must not be granted before aEnd. If the server let the
			// grant expire anyway, B hears of it within a few ms.
			tm := time.NewTimer(150 * time.Millisecond)
			e, ok := w.next(tm.C)
			tm.Stop()
			if ok {
				gb := w.finish(e)
				if gb.Outcome == OK && gb.Complete < aEnd {
					early++
				}
				if gb.Outcome == OK {
					cb.release(ctx, cb.conns[0], key, ownerB)
				}
				w.close()
				ca.release(ctx, ca.conns[0], key, ownerA)
				continue
			}
			ca.release(ctx, ca.conns[0], key, ownerA)
		case Failed:
			lost++
		default:
			unknown++
			ca.release(ctx, ca.conns[0], key, ownerA)
		}
		// B is granted now (A released, or A's grant expired).
		tm := time.NewTimer(callTimeout)
		e, ok := w.next(tm.C)
		tm.Stop()
		if !ok {
			w.close()
			t.Fatalf("attempt %d: B not granted within %v after A's grant ended", i, callTimeout)
		}
		if gb := w.finish(e); gb.Outcome == OK {
			cb.release(ctx, cb.conns[0], key, ownerB)
		}
		w.close()
	}
	rep, err := Check(rec.Ops())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d attempts: renewal to %v acknowledged %d times, answered lost %d times, unanswered %d times; B granted before A's acknowledged validity end %d times",
		attempts, newTTL, acked, lost, unknown, early)
	t.Logf("history: %s", rep.Stats.Summary())
	if err := rep.Err(5); err != nil {
		t.Errorf("an acknowledged renewal with a new TTL did not protect the grant: %v", err)
	}
}

// TestHistory_RetriedAcquireNewTTL: A holds a key with a 200 ms TTL and B
// waits for it; A's Acquire is retried with a TTL of 3600 s. When the
// server answers "granted" with that TTL, A believes itself valid for an
// hour from the retry: B must not be granted in the next 0.5 s. (The server
// may instead refuse the retry, or answer the TTL it keeps; the test then
// checks that answer.)
func TestHistory_RetriedAcquireNewTTL(t *testing.T) {
	const (
		attempts = 3
		ttl      = 200 * time.Millisecond
		retryTTL = 3600 * time.Second
		watch    = 500 * time.Millisecond
	)
	sd := seed(t)
	srv := startServer(t)
	pa := netproxy.Start(t, srv.Addr(), sd)
	pb := netproxy.Start(t, srv.Addr(), sd+1)
	for _, p := range []*netproxy.Proxy{pa, pb} {
		p.SetDelay(netproxy.Upstream, 0, 2*time.Millisecond)
		p.SetDelay(netproxy.Downstream, 0, 2*time.Millisecond)
	}
	rec := NewRecorder()
	var badArg atomic.Int64
	ca := &caller{t: t, id: 1, rec: rec, conns: []dlockv1.LockClient{dial(t, pa.Addr())}, rng: rand.New(rand.NewPCG(sd, 1)), badArg: &badArg}
	cb := &caller{t: t, id: 2, rec: rec, conns: []dlockv1.LockClient{dial(t, pb.Addr())}, rng: rand.New(rand.NewPCG(sd, 2)), badArg: &badArg}
	ctx := t.Context()
	for i := range attempts {
		key := fmt.Sprintf("retry-ttl/%d", i)
		ownerA, ownerB := ca.newOwner(i), cb.newOwner(i)
		ga, _ := ca.acquire(ctx, ca.conns[0], key, ownerA, ttl, false, callTimeout, "A")
		if ga.Outcome != OK {
			t.Fatalf("attempt %d: A's acquire of a free key: %s", i, &ga)
		}
		w, err := cb.startWait(ctx, cb.conns[0], key, ownerB, 10*time.Second, 10*time.Second)
		if err != nil {
			t.Fatalf("attempt %d: B's wait: %v", i, err)
		}
		if e, _ := w.next(nil); e.err != nil || e.ev.GetType() != dlockv1.WaitEvent_QUEUED {
			w.close()
			t.Fatalf("attempt %d: B's wait: want QUEUED first, got %v %v", i, e.ev, e.err)
		}
		retry, _ := ca.acquire(ctx, ca.conns[0], key, ownerA, retryTTL, false, callTimeout, "retry by the owner")
		aEnd := validityOf(&ga, 0)
		switch {
		case retry.Outcome == OK && retry.Fence != ga.Fence:
			t.Errorf("attempt %d: the owner's retry, sent while its grant was valid (until %s), was answered with a new fence: %s (first grant: %s)", i, ms(aEnd), &retry, &ga)
		case retry.Outcome == OK:
			aEnd = max(aEnd, validityOf(&retry, 0))
			t.Logf("attempt %d: retry answered granted, fence %d, TTL %v: A is valid until %s", i, retry.Fence, retry.GrantTTL, ms(aEnd))
		default:
			t.Logf("attempt %d: retry refused: %s", i, &retry)
		}
		tm := time.NewTimer(watch)
		e, ok := w.next(tm.C)
		tm.Stop()
		if ok {
			gb := w.finish(e)
			if gb.Outcome == OK && gb.Complete < aEnd {
				t.Errorf("attempt %d: B was granted %v after A's retry was answered, while A believes itself valid for %v more:\n\tA's grant: %s\n\tA's retry: %s\n\tB's grant: %s",
					i, gb.Complete-retry.Complete, aEnd-gb.Complete, &ga, &retry, &gb)
			}
			if gb.Outcome == OK {
				cb.release(ctx, cb.conns[0], key, ownerB)
			}
			w.close()
			continue
		}
		ca.release(ctx, ca.conns[0], key, ownerA)
		tm = time.NewTimer(callTimeout)
		e, ok = w.next(tm.C)
		tm.Stop()
		if !ok {
			w.close()
			t.Fatalf("attempt %d: B not granted within %v after A released", i, callTimeout)
		}
		if gb := w.finish(e); gb.Outcome == OK {
			cb.release(ctx, cb.conns[0], key, ownerB)
		}
		w.close()
	}
	rep, err := Check(rec.Ops())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("history: %s", rep.Stats.Summary())
	if err := rep.Err(5); err != nil {
		t.Errorf("checker: %v", err)
	}
}

// TestHistory_ShorterTTLRenewalKeepsAcknowledgedEnd: A holds a key with a
// 400 ms TTL and B waits for it; A renews with a 100 ms TTL. An
// acknowledged renewal never shortens what an earlier acknowledgment
// promised (the checker's max rule: a client whose shortening renewal goes
// unanswered still relies on the earlier end), so B must not be granted
// before A's grant's own end, 400 ms − drift after A's acquire was sent.
// The server may refuse the shorter TTL, or keep the countdown at the later
// of the two ends and apply the new TTL from the next renewal.
func TestHistory_ShorterTTLRenewalKeepsAcknowledgedEnd(t *testing.T) {
	const (
		attempts = 3
		ttl      = 400 * time.Millisecond
		shorter  = 100 * time.Millisecond
	)
	sd := seed(t)
	srv := startServer(t)
	pa := netproxy.Start(t, srv.Addr(), sd)
	pb := netproxy.Start(t, srv.Addr(), sd+1)
	for _, p := range []*netproxy.Proxy{pa, pb} {
		p.SetDelay(netproxy.Upstream, 0, 2*time.Millisecond)
		p.SetDelay(netproxy.Downstream, 0, 2*time.Millisecond)
	}
	rec := NewRecorder()
	var badArg atomic.Int64
	ca := &caller{t: t, id: 1, rec: rec, conns: []dlockv1.LockClient{dial(t, pa.Addr())}, rng: rand.New(rand.NewPCG(sd, 1)), badArg: &badArg}
	cb := &caller{t: t, id: 2, rec: rec, conns: []dlockv1.LockClient{dial(t, pb.Addr())}, rng: rand.New(rand.NewPCG(sd, 2)), badArg: &badArg}
	ctx := t.Context()
	for i := range attempts {
		key := fmt.Sprintf("shorter-ttl/%d", i)
		ownerA, ownerB := ca.newOwner(i), cb.newOwner(i)
		ga, _ := ca.acquire(ctx, ca.conns[0], key, ownerA, ttl, false, callTimeout, "A")
		if ga.Outcome != OK {
			t.Fatalf("attempt %d: A's acquire of a free key: %s", i, &ga)
		}
		w, err := cb.startWait(ctx, cb.conns[0], key, ownerB, 10*time.Second, 10*time.Second)
		if err != nil {
			t.Fatalf("attempt %d: B's wait: %v", i, err)
		}
		if e, _ := w.next(nil); e.err != nil || e.ev.GetType() != dlockv1.WaitEvent_QUEUED {
			w.close()
			t.Fatalf("attempt %d: B's wait: want QUEUED first, got %v %v", i, e.ev, e.err)
		}
		r := ca.renew(ctx, ca.conns[0], key, ownerA, shorter, "shorter TTL")
		aEnd := validityOf(&ga, 0)
		t.Logf("attempt %d: renewal to %v answered %s; A is valid until %s", i, shorter, r.Outcome, ms(aEnd))
		// Watch B until A's end and 100 ms more, then release A.
		tm := time.NewTimer(aEnd - rec.Now() + 100*time.Millisecond)
		e, ok := w.next(tm.C)
		tm.Stop()
		if !ok {
			ca.release(ctx, ca.conns[0], key, ownerA)
			tm = time.NewTimer(callTimeout)
			e, ok = w.next(tm.C)
			tm.Stop()
			if !ok {
				w.close()
				t.Fatalf("attempt %d: B not granted within %v after A released", i, callTimeout)
			}
		}
		gb := w.finish(e)
		if gb.Outcome == OK && gb.Complete < aEnd {
			t.Errorf("attempt %d: B was granted %v before the end of A's acknowledged grant, after A's renewal to a shorter TTL:\n\tA's grant:   %s\n\tA's renewal: %s\n\tB's grant:   %s",
				i, aEnd-gb.Complete, &ga, &r, &gb)
		}
		if gb.Outcome == OK {
			cb.release(ctx, cb.conns[0], key, ownerB)
		}
		w.close()
	}
	rep, err := Check(rec.Ops())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("history: %s", rep.Stats.Summary())
	if err := rep.Err(5); err != nil {
		t.Errorf("checker: %v", err)
	}
}
