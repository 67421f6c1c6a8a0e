package dlockddriver_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// sessionTries counts the try-acquires a Driver sends on its Session
// stream.
type sessionTries struct{ n atomic.Int32 }

func (c *sessionTries) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != dlockv1.Lock_Session_FullMethodName {
		return s, err
	}
	return &countingStream{ClientStream: s, c: c}, nil
}

type countingStream struct {
	grpc.ClientStream
	c *sessionTries
}

func (s *countingStream) SendMsg(m any) error {
	if r, ok := m.(*dlockv1.SessionRequest); ok && r.GetAcquire() != nil {
		s.c.n.Add(1)
	}
	return s.ClientStream.SendMsg(m)
}

// TestWaiter_QueuesAtOnceAfterItsReleaseHandedTheKeyOn: a Wait for a key
// that this Driver's last release handed to a waiter queues at once,
// without the Session try-acquire that the key, held by that waiter, would
// refuse; any other Wait tries first. Both are granted as usual.
func TestWaiter_QueuesAtOnceAfterItsReleaseHandedTheKeyOn(t *testing.T) {
	srv, req := startClaimWindow(t, time.Minute, "handed/k")
	ctx := t.Context()
	tries := &sessionTries{}
	a := dial(t, srv.Addr(), &dlockddriver.Options{DialOptions: []grpc.DialOption{grpc.WithStreamInterceptor(tries.intercept)}})
	b := dial(t, srv.Addr(), nil)
	waitUntil(t, func() bool { return dlockddriver.SessionOpen(a) })

	// A Wait for a free key tries first, and is granted by the try.
	if _, err := a.Wait(ctx, req("a")); err != nil {
		t.Fatal(err)
	}
	if n := tries.n.Load(); n != 1 {
		t.Fatalf("a Wait for a free key sent %d Session tries, want 1", n)
	}
	bWait := goWait(ctx, b, req("b"))
	awaitWaiters(t, a, "handed/k", 1)
	if err := a.Release(ctx, "handed/k", req("a").Owner); err != nil {
		t.Fatal(err)
	}
	gb := recvWait(t, bWait, 5*time.Second)

	// a's release handed the key to b: a's next Wait queues without a try.
	aWait := goWait(ctx, a, req("a"))
	awaitWaiters(t, b, "handed/k", 1)
	if n := tries.n.Load(); n != 1 {
		t.Fatalf("a Wait after a release that handed the key on sent a Session try (%d tries in all, want 1)", n)
	}
	if err := b.Release(ctx, "handed/k", req("b").Owner); err != nil {
		t.Fatal(err)
	}
	ga := recvWait(t, aWait, 5*time.Second)
	if ga.Fence <= gb.Fence {
		t.Fatalf("a's fence %d after b's %d", ga.Fence, gb.Fence)
	}
	// This release handed nothing on (nobody waits): the next Wait tries.
	if err := a.Release(ctx, "handed/k", req("a").Owner); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Wait(ctx, req("a")); err != nil {
		t.Fatal(err)
	}
	if n := tries.n.Load(); n != 2 {
		t.Fatalf("a Wait after a release with nobody waiting: %d Session tries in all, want 2", n)
	}
}
