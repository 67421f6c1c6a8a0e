package server

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// TestSession_CancelFalseAndBusyID: a request with cancel: false is an
// empty call answered INVALID_ARGUMENT (it used to cancel, unanswered), and
// a call whose id is that of a running call is answered INVALID_ARGUMENT
// without running (both used to run); once answered, an id may be reused.
func TestSession_CancelFalseAndBusyID(t *testing.T) {
	cfg, _ := internalConfig(t)
	s := startInternal(t, cfg)
	c := internalClient(t, s.Addr())
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	st, err := c.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recv := func() *dlockv1.SessionResponse {
		t.Helper()
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	send := func(req *dlockv1.SessionRequest) {
		t.Helper()
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}

	send(&dlockv1.SessionRequest{Id: 7, Call: &dlockv1.SessionRequest_Cancel{Cancel: false}})
	if r := recv(); r.GetId() != 7 || codes.Code(r.GetCode()) != codes.InvalidArgument {
		t.Fatalf("cancel: false: %+v, want INVALID_ARGUMENT for id 7", r)
	}

	// The first Session call blocks in the hook until release closes.
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := func(w string) {
		if w == "Session call" {
			once.Do(func() { close(entered); <-release })
		}
	}
	panicHook.Store(&h)
	t.Cleanup(func() { panicHook.Store(nil) })
	var released sync.Once
	defer released.Do(func() { close(release) })

	const owner = "owner-busy-0123456789"
	acq := &dlockv1.SessionRequest{Id: 1, Call: &dlockv1.SessionRequest_Acquire{Acquire: &dlockv1.AcquireRequest{Key: "busy", Owner: owner, Ttl: durationpb.New(time.Minute)}}}
	send(acq)
	<-entered
	other := "owner-other-0123456789"
	send(&dlockv1.SessionRequest{Id: 1, Call: &dlockv1.SessionRequest_Acquire{Acquire: &dlockv1.AcquireRequest{Key: "busy2", Owner: other, Ttl: durationpb.New(time.Minute)}}})
	r := recv()
	if r.GetId() != 1 || codes.Code(r.GetCode()) != codes.InvalidArgument || !strings.Contains(r.GetMessage(), "id 1 is in use") {
		t.Fatalf("second call with a running id: %+v, want INVALID_ARGUMENT \"id 1 is in use\"", r)
	}
	released.Do(func() { close(release) })
	if r := recv(); r.GetId() != 1 || r.GetCode() != 0 || r.GetAcquire().GetFence() == 0 {
		t.Fatalf("first call: %+v", r)
	}
	// The refused call did not run: busy2 is free.
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "busy2", Owner: "owner-third-0123456789", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatalf("busy2 was acquired by the refused call: %v", err)
	}
	// Once answered, the id is free again.
	send(&dlockv1.SessionRequest{Id: 1, Call: &dlockv1.SessionRequest_Release{Release: &dlockv1.ReleaseRequest{Key: "busy", Owner: owner}}})
	if r := recv(); r.GetId() != 1 || r.GetCode() != 0 {
		t.Fatalf("reused id: %+v", r)
	}
}

// TestCallPool_WorkersGrowWithTheLoadAndRetire: with every worker busy a
// call starts a worker of its own at once (a slow call delays no other),
// the workers a busy moment started serve later calls, and they end after
// callWorkerIdle without one, down to the permanent ones; past
// maxCallWorkers calls still run, on goroutines that end with them.
func TestCallPool_WorkersGrowWithTheLoadAndRetire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stop := make(chan struct{})
		defer close(stop)
		p := newCallPool(2, stop)
		synctest.Wait()
		release := make(chan struct{})
		var running sync.WaitGroup
		const n = 10
		running.Add(n)
		for range n {
			p.run(func() { running.Done(); <-release })
		}
		running.Wait() // all ten run at once: none waited for a worker
		if got := p.workers.Load(); got != n {
			t.Fatalf("%d workers with %d calls running, want %d", got, n, n)
		}
		close(release)
		synctest.Wait()
		// The workers stay a while and take the next calls.
		var done sync.WaitGroup
		done.Add(n)
		for range n {
			p.run(done.Done)
		}
		done.Wait()
		if got := p.workers.Load(); got != n {
			t.Fatalf("%d workers right after the burst, want the %d it started still there", got, n)
		}
		time.Sleep(callWorkerIdle + time.Millisecond)
		synctest.Wait()
		if got := p.workers.Load(); got != 2 {
			t.Fatalf("%d workers after %v idle, want the 2 permanent ones", got, callWorkerIdle)
		}

		// Past the cap a call still runs at once, and its goroutine does
		// not count as a worker.
		block := make(chan struct{})
		running.Add(maxCallWorkers + 5)
		for range maxCallWorkers + 5 {
			p.run(func() { running.Done(); <-block })
		}
		running.Wait()
		if got := p.workers.Load(); got != maxCallWorkers {
			t.Fatalf("%d workers at the cap, want %d", got, maxCallWorkers)
		}
		close(block)
		time.Sleep(callWorkerIdle + time.Millisecond)
		synctest.Wait()
		if got := p.workers.Load(); got != 2 {
			t.Fatalf("%d workers after the capped burst went idle, want 2", got)
		}
	})
}
