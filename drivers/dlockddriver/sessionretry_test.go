package dlockddriver_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestDriver_SessionReopensWhenUnaryCallsSucceed: a dlockd restarted with
// production Raft timeouts refuses the Session stream until it wins its
// election (about a second), and the Driver's Session loop backs off 50 ms
// doubling to 2 s between attempts. Calls meanwhile take the unary RPCs;
// the first of them that succeeds (the server leads again) cuts the loop's
// pause short, so the stream opens within milliseconds of it (0–7 ms
// here), where the backoff alone left calls on the unary path 170 ms to
// 1.2 s more (six restarts measured without the change: all six slower
// than the bound). Four restarts, and at most two of them slower than the
// bound (stalls of a loaded machine: one round in four reached 530 ms with
// a make test beside it).
func TestDriver_SessionReopensWhenUnaryCallsSucceed(t *testing.T) {
	p := servertest.StartProcess(t, "--raft-heartbeat-timeout", "1s", "--raft-election-timeout", "1s", "--raft-leader-lease-timeout", "500ms")
	d := dial(t, p.Addr(), nil)
	waitSession(t, d, true, 10*time.Second)
	const bound = 150 * time.Millisecond
	slow := 0
	for round := range 4 {
		if err := p.Stop(); err != nil {
			t.Fatal(err)
		}
		// The Driver learns of the stopped server when its stream's receive
		// fails, a moment after the process is reaped.
		waitSession(t, d, false, 5*time.Second)
		var firstOK atomic.Int64 // unix nanoseconds of the first successful cycle after the restart
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
				err := cycle(ctx, d, fmt.Sprintf("reopen:%d:%d", round, i))
				cancel()
				if err == nil {
					firstOK.CompareAndSwap(0, time.Now().UnixNano())
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		if err := p.Start(); err != nil {
			close(stop)
			<-done
			t.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			close(stop)
			<-done
			t.Fatalf("round %d: no lock cycle succeeded within 15 s of the restart", round)
		}
		ok := time.Unix(0, firstOK.Load())
		opened := waitSession(t, d, true, 10*time.Second)
		gap := opened.Sub(ok)
		t.Logf("round %d: Session stream open %v after the first successful unary cycle", round, gap.Round(time.Millisecond))
		if gap > bound {
			slow++
		}
		// A cycle on the stream: the server accepted it (its answer resets
		// the loop's backoff, as a stream in use for a while does).
		if err := cycle(t.Context(), d, fmt.Sprintf("reopened:%d", round)); err != nil {
			t.Fatalf("round %d: a cycle on the reopened stream: %v", round, err)
		}
	}
	if slow > 2 {
		t.Fatalf("the Session stream reopened more than %v after the first successful unary call in %d of 4 restarts: the loop waits out its backoff", bound, slow)
	}
}

// waitSession waits until d's Session stream is open (open) or closed
// (!open), polled every 5 ms, and returns when it saw it so.
func waitSession(t *testing.T, d *dlockddriver.Driver, open bool, limit time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(limit)
	for dlockddriver.SessionOpen(d) != open {
		if time.Now().After(deadline) {
			t.Fatalf("the Session stream is not %s after %v", map[bool]string{true: "open", false: "closed"}[open], limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Now()
}

// refusingFollower answers unary acquisitions and releases (as a follower
// that forwards them to its leader does) and refuses every Session stream
// with NOT_LEADER and no leader hint (streams are not forwarded): a Driver
// that cannot reach the leader itself.
type refusingFollower struct {
	dlockv1.UnimplementedLockServer
	sessions atomic.Int64
	fence    atomic.Uint64
}

func (s *refusingFollower) Acquire(context.Context, *dlockv1.AcquireRequest) (*dlockv1.AcquireResponse, error) {
	return &dlockv1.AcquireResponse{Fence: s.fence.Add(1)}, nil
}

func (s *refusingFollower) Release(context.Context, *dlockv1.ReleaseRequest) (*dlockv1.ReleaseResponse, error) {
	return &dlockv1.ReleaseResponse{}, nil
}

func (s *refusingFollower) Session(dlockv1.Lock_SessionServer) error {
	s.sessions.Add(1)
	return status.Error(codes.Unavailable, "dlockd: not ready: not the leader or catching up (NOT_LEADER)")
}

// TestDriver_SessionRefusedWhileUnaryCallsSucceedKeepsItsBackoff: a server
// that answers every unary write but refuses every Session stream gets the
// stream asked for about as often as the backoff alone asks (50 ms doubling
// to 2 s: 7 attempts in 4 s), not every 100 ms: the first version of the
// kick reopened it about 10 times a second, for every Driver of every
// process pinned to such a node (found by a helper's break test: 60 refused
// streams in 6 s, against 8). Each pause a write cuts short doubles the
// next one's floor. The server is a stand-in: a real dlockd follower names
// its leader in the refusal, and the Driver follows it or, when it cannot,
// lets no write cut its pause.
func TestDriver_SessionRefusedWhileUnaryCallsSucceedKeepsItsBackoff(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	fs := &refusingFollower{}
	dlockv1.RegisterLockServer(srv, fs)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	d := dlockddriver.New(cc, &dlockddriver.Options{NoWatch: true})
	t.Cleanup(func() { _ = d.Close() })
	const run = 4 * time.Second
	end := time.Now().Add(run)
	calls := 0
	for i := 0; time.Now().Before(end); i++ {
		if err := cycle(t.Context(), d, fmt.Sprintf("k%d", i)); err != nil {
			t.Fatal(err)
		}
		calls++
		time.Sleep(20 * time.Millisecond)
	}
	n := fs.sessions.Load()
	t.Logf("%d unary lock cycles answered, %d Session streams refused in %v", calls, n, run)
	if n > 9 {
		t.Fatalf("%d Session streams in %v while unary writes succeeded and every stream was refused: want about the backoff's 7", n, run)
	}
}
