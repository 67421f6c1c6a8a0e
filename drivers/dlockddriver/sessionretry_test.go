package dlockddriver_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestDriver_SessionReopensWhenUnaryCallsSucceed: a dlockd restarted with
// production Raft timeouts refuses the Session stream until it wins its
// election (about a second), and the Driver's Session loop backs off 50 ms
// doubling to 2 s between attempts. Calls meanwhile take the unary RPCs;
// the first of them that succeeds (the server leads again) cuts the loop's
// pause short, so the stream opens within milliseconds of it (0–7 ms
// here), where the backoff alone left calls on the unary path 170 ms to
// 1.2 s more (six restarts measured without the change). Four restarts, and
// at most one of them slower than the bound (a stall of a loaded machine).
func TestDriver_SessionReopensWhenUnaryCallsSucceed(t *testing.T) {
	p := servertest.StartProcess(t, "--raft-heartbeat-timeout", "1s", "--raft-election-timeout", "1s", "--raft-leader-lease-timeout", "500ms")
	d := dial(t, p.Addr(), nil)
	waitSessionOpen(t, d, 10*time.Second)
	const bound = 150 * time.Millisecond
	slow := 0
	for round := range 4 {
		if err := p.Stop(); err != nil {
			t.Fatal(err)
		}
		if dlockddriver.SessionOpen(d) {
			t.Fatalf("round %d: the Session stream is still open with the server stopped", round)
		}
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
		opened := waitSessionOpen(t, d, 10*time.Second)
		gap := opened.Sub(ok)
		t.Logf("round %d: Session stream open %v after the first successful unary cycle", round, gap.Round(time.Millisecond))
		if gap > bound {
			slow++
		}
	}
	if slow > 1 {
		t.Fatalf("the Session stream reopened more than %v after the first successful unary call in %d of 4 restarts: the loop waits out its backoff", bound, slow)
	}
}

// waitSessionOpen waits until d's Session stream is open and returns when
// it saw it open (polled every 5 ms).
func waitSessionOpen(t *testing.T, d *dlockddriver.Driver, limit time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !dlockddriver.SessionOpen(d) {
		if time.Now().After(deadline) {
			t.Fatalf("the Session stream did not open within %v", limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Now()
}
