package clustertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dlock-dev/dlock"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server/historytest"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestMain fails the package when a test leaves a goroutine behind (a
// Locker or proxy not closed, a process not reaped) and removes the dlockd
// binary built for the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	servertest.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// world is one test's cluster, recorder and clients.
type world struct {
	t   *testing.T
	c   *servertest.Cluster
	rec *historytest.Recorder

	mu      sync.Mutex
	clients int
}

func newWorld(t *testing.T, n int, opts servertest.ClusterOptions) *world {
	t.Helper()
	c := servertest.StartCluster(t, n, opts)
	return &world{t: t, c: c, rec: historytest.NewRecorder()}
}

// client opens a recorded Locker on storeURL (all members when empty),
// closed when the test ends.
func (w *world) client(storeURL string, opts ...dlock.Option) (*dlock.Locker, int) {
	w.t.Helper()
	if storeURL == "" {
		storeURL = w.c.URL()
	}
	w.mu.Lock()
	w.clients++
	id := w.clients
	w.mu.Unlock()
	l, err := OpenLocker(context.Background(), storeURL, w.rec, id, opts...)
	if err != nil {
		w.t.Fatalf("client %d: open %s: %v", id, storeURL, err)
	}
	w.t.Cleanup(func() { _ = l.Close() })
	return l, id
}

// check checks the history recorded so far, logs its summary, and fails
// the test on a violation.
func (w *world) check() *historytest.Report {
	w.t.Helper()
	rep, err := historytest.Check(w.rec.Ops())
	if err != nil {
		w.t.Fatalf("history: %v", err)
	}
	w.t.Logf("history: %s", rep.Stats.Summary())
	if err := rep.Err(10); err != nil {
		w.t.Errorf("%v", err)
	}
	return rep
}

// ctx returns a context ending after d, or at the end of the test.
func (w *world) ctx(d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	w.t.Cleanup(cancel)
	return ctx
}

// leader waits for a leader (not in exclude) for up to d.
func (w *world) leader(d time.Duration, exclude ...int) int {
	w.t.Helper()
	i, err := w.c.WaitLeader(w.ctx(d), exclude...)
	if err != nil {
		w.t.Fatal(err)
	}
	return i
}

// others returns the node indexes of 0..n-1 other than skip.
func others(n int, skip ...int) []int {
	var r []int
next:
	for i := 0; i < n; i++ {
		for _, s := range skip {
			if i == s {
				continue next
			}
		}
		r = append(r, i)
	}
	return r
}

// holders is a set of clients each holding one key, counting losses.
type holders struct {
	leases []*dlock.Lease
	lost   atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	why    []string
}

// hold makes n clients (one Locker each, on storeURL) acquire
// prefix-0..prefix-(n-1) with ttl, and watches their leases.
func (w *world) hold(n int, prefix, storeURL string, ttl time.Duration, opts ...dlock.Option) *holders {
	w.t.Helper()
	h := &holders{leases: make([]*dlock.Lease, n)}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		l, _ := w.client(storeURL, append([]dlock.Option{dlock.WithTTL(ttl)}, opts...)...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ls, err := l.Acquire(ctx, fmt.Sprintf("%s-%d", prefix, i))
			if err != nil {
				errs <- err
				return
			}
			h.leases[i] = ls
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		w.t.Fatalf("holders %s: %v", prefix, err)
	}
	for _, ls := range h.leases {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			<-ls.Done()
			if errors.Is(ls.Err(), dlock.ErrLeaseLost) {
				h.lost.Add(1)
				h.mu.Lock()
				h.why = append(h.why, fmt.Sprintf("%s fence %d: %v", ls.Key(), ls.Fence(), ls.Err()))
				h.mu.Unlock()
			}
		}()
	}
	w.t.Cleanup(h.release)
	return h
}

// release releases every lease still held and waits for the watchers.
func (h *holders) release() {
	var wg sync.WaitGroup
	for _, ls := range h.leases {
		if ls == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = ls.Release(ctx)
		}()
	}
	wg.Wait()
	h.wg.Wait()
}

// losses returns the number of leases lost and why.
func (h *holders) losses() (int, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return int(h.lost.Load()), strings.Join(h.why, "\n")
}

// churn is n clients that acquire prefix-K (K among keys), hold it for a
// moment and release it, until halted, counting grants and errors.
type churn struct {
	grants, errs atomic.Int64
	base         context.Context
	stop         context.CancelFunc
	wg           sync.WaitGroup
}

func (w *world) churn(n, keys int, prefix, storeURL string, ttl time.Duration) *churn {
	ch := &churn{}
	ch.base, ch.stop = context.WithCancel(context.Background())
	for i := 0; i < n; i++ {
		l, _ := w.client(storeURL, dlock.WithTTL(ttl), dlock.WithOpTimeout(2*time.Second))
		ch.wg.Add(1)
		go func() {
			defer ch.wg.Done()
			for k := 0; ch.base.Err() == nil; k++ {
				ctx, cancel := context.WithTimeout(ch.base, 3*time.Second)
				ls, err := l.Acquire(ctx, fmt.Sprintf("%s-%d", prefix, (i+k)%keys))
				cancel()
				if err != nil {
					ch.errs.Add(1)
					continue
				}
				ch.grants.Add(1)
				time.Sleep(5 * time.Millisecond)
				rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Second)
				_ = ls.Release(rctx)
				rcancel()
			}
		}()
	}
	w.t.Cleanup(ch.halt)
	return ch
}

// halt stops the churn and waits for its clients.
func (ch *churn) halt() {
	ch.stop()
	ch.wg.Wait()
}

// raw is a gRPC client of one node's real API address that marks its calls
// as forwarded (metadata dlock-forwarded: 1), so that the node answers them
// itself and never forwards them: a probe of what that node acknowledges.
// Its calls are recorded as client id.
type raw struct {
	w    *world
	id   int
	lock dlockv1.LockClient
}

func (w *world) raw(node int) *raw {
	w.t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+w.c.Node(node).Listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = cc.Close() })
	w.mu.Lock()
	w.clients++
	id := w.clients
	w.mu.Unlock()
	return &raw{w: w, id: id, lock: dlockv1.NewLockClient(cc)}
}

func rawOutcome(err error) historytest.Outcome {
	if err == nil {
		return historytest.OK
	}
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.NotFound:
		return historytest.Failed
	}
	return historytest.Unknown
}

// acquire asks for key without wait, with ttl, and records the call.
func (r *raw) acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "dlock-forwarded", "1")
	inv := r.w.rec.Now()
	resp, err := r.lock.Acquire(ctx, &dlockv1.AcquireRequest{Key: key, Owner: owner, Ttl: durationpb.New(ttl)})
	op := historytest.Op{Client: r.id, Kind: historytest.Acquire, Key: key, Owner: owner, TTL: ttl,
		Invoke: inv, Complete: r.w.rec.Now(), Outcome: rawOutcome(err), Note: "raw"}
	if err == nil {
		op.Fence, op.GrantTTL, op.ClaimWithin = resp.GetFence(), resp.GetTtl().AsDuration(), resp.GetClaimWithin().AsDuration()
	} else {
		op.Note += ": " + err.Error()
	}
	r.w.rec.Add(op)
	if err != nil {
		return 0, err
	}
	return resp.GetFence(), nil
}

// renew renews owner's grant of key with ttl and records the call; ok is
// the server's answer for the item.
func (r *raw) renew(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "dlock-forwarded", "1")
	inv := r.w.rec.Now()
	resp, err := r.lock.Renew(ctx, &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: key, Owner: owner, Ttl: durationpb.New(ttl)}}})
	op := historytest.Op{Client: r.id, Kind: historytest.Renew, Key: key, Owner: owner, TTL: ttl,
		Invoke: inv, Complete: r.w.rec.Now(), Outcome: rawOutcome(err), Note: "raw"}
	ok := false
	if err == nil {
		if res := resp.GetResults(); len(res) == 1 && res[0].GetOk() {
			ok = true
		} else {
			op.Outcome = historytest.Failed
		}
	} else {
		op.Note += ": " + err.Error()
	}
	r.w.rec.Add(op)
	return ok, err
}

// ensureLeader makes node i the leader again if leadership moved away from
// it (an election on a loaded machine), within 15s, so that a fault meant
// for the leader hits the leader.
func (w *world) ensureLeader(i int) {
	w.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		cur, err := w.c.Leader(ctx)
		if err == nil && cur == i {
			cancel()
			return
		}
		if err == nil {
			w.t.Logf("leadership moved to %s during the set-up; transferring it back to %s", w.c.Node(cur).ID, w.c.Node(i).ID)
			_ = w.c.TransferLeader(ctx, i)
		}
		cancel()
		if time.Now().After(deadline) {
			w.t.Fatalf("%s is not the leader again within 15s (leader %d, %v)", w.c.Node(i).ID, cur, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
