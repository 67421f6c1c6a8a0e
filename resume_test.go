package dlock_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
)

// slowResumer delays every Resume by delay, to check where validity is
// measured from.
type slowResumer struct {
	*memdriver.Driver
	delay time.Duration
}

func (s slowResumer) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	time.Sleep(s.delay)
	return s.Driver.Resume(ctx, req, fence)
}

// plainDriver hides every optional capability, Resumer included.
type plainDriver struct{ driver.Driver }

// TestResume_ActsAsFreshLease: a lease resumed by another Locker (another
// process) keeps key, owner and fence; its validity is measured from the
// moment the Resume request was sent (a slow answer is subtracted); it
// renews by its own heartbeat past the TTL after the first holder died; the
// observer sees "resumed", its renewals and its end; Release frees the key
// and the token is then ErrLeaseLost.
func TestResume_ActsAsFreshLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memdriver.NewStore()
		fd := dlocktest.NewFaultDriver(memdriver.New(store), t.Logf)
		first := dlock.New(fd, dlock.WithTTL(3*time.Second))
		defer first.Close()
		rec := &recorder{}
		second := dlock.New(slowResumer{memdriver.New(store), 500 * time.Millisecond}, dlock.WithObserver(rec))
		defer second.Close()
		other := dlock.New(memdriver.New(store))
		defer other.Close()

		ls, err := first.Acquire(t.Context(), "job", dlock.WithHolder("run 1"))
		if err != nil {
			t.Fatal(err)
		}
		tok := ls.Token()
		if tok != (dlock.LeaseToken{Key: "job", Owner: ls.Owner(), Fence: ls.Fence(), TTL: 3 * time.Second}) {
			t.Fatalf("Token() = %+v", tok)
		}
		dlocktest.Faults(fd).BlockRenewals(true) // the first process is gone
		time.Sleep(2 * time.Second)
		sent := time.Now()
		rs, err := second.Resume(t.Context(), tok)
		if err != nil {
			t.Fatal(err)
		}
		if rs.Key() != "job" || rs.Owner() != tok.Owner || rs.Fence() != tok.Fence || rs.TTL() != tok.TTL {
			t.Fatalf("resumed lease %q %q %d %v, want the token's %+v", rs.Key(), rs.Owner(), rs.Fence(), rs.TTL(), tok)
		}
		if want := sent.Add(3*time.Second - 32*time.Millisecond); !rs.Deadline().Equal(want) {
			t.Errorf("deadline %v after the Resume was sent, want %v (sent + TTL − drift)", rs.Deadline().Sub(sent), want.Sub(sent))
		}
		time.Sleep(10 * time.Second) // far past both TTLs
		if rs.Err() != nil {
			t.Fatalf("resumed lease ended: %v", rs.Err())
		}
		if !errors.Is(ls.Err(), dlock.ErrLeaseLost) {
			t.Errorf("first lease Err %v, want ErrLeaseLost (its renewals were blocked)", ls.Err())
		}
		if _, err := other.TryAcquire(t.Context(), "job"); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire of the resumed key = %v, want ErrNotAcquired", err)
		}
		if err := rs.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, err := second.Resume(t.Context(), tok); !errors.Is(err, dlock.ErrLeaseLost) {
			t.Errorf("Resume after Release = %v, want ErrLeaseLost", err)
		}
		free, err := other.TryAcquire(t.Context(), "job")
		if err != nil {
			t.Fatalf("key not free after the resumed lease's Release: %v", err)
		}
		_ = free.Release(t.Context())
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if len(rec.acquires) != 2 || rec.acquires[0].Result != dlock.ResultResumed || rec.acquires[0].Latency != 500*time.Millisecond || rec.acquires[1].Result == dlock.ResultResumed {
			t.Errorf("acquire events %+v, want resumed (500ms) then a failure", rec.acquires)
		}
		if len(rec.renews) == 0 || len(rec.ends) != 1 || rec.ends[0].Lost {
			t.Errorf("renew events %d, end events %+v; want renewals and one release", len(rec.renews), rec.ends)
		}
	})
}

// TestResume_Errors: malformed tokens are ErrInvalidArgument before the
// store is asked; a store without driver.Resumer is ErrUnsupported naming
// the store; a wrong fence is ErrLeaseLost and leaves the grant alone; an
// ended ctx matches ctx.Err(); a closed Locker is ErrClosed.
func TestResume_Errors(t *testing.T) {
	store := memdriver.NewStore()
	l := dlock.New(memdriver.New(store), dlock.WithTTL(time.Minute))
	defer l.Close()
	ctx := t.Context()
	ls, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Release(ctx)
	tok := ls.Token()
	bad := func(f func(*dlock.LeaseToken)) dlock.LeaseToken { c := tok; f(&c); return c }
	for name, b := range map[string]dlock.LeaseToken{
		"empty key":    bad(func(c *dlock.LeaseToken) { c.Key = "" }),
		"NUL in key":   bad(func(c *dlock.LeaseToken) { c.Key = "a\x00b" }),
		"no owner":     bad(func(c *dlock.LeaseToken) { c.Owner = "" }),
		"owner spaces": bad(func(c *dlock.LeaseToken) { c.Owner = "a b" }),
		"fence 0":      bad(func(c *dlock.LeaseToken) { c.Fence = 0 }),
		"TTL 0":        bad(func(c *dlock.LeaseToken) { c.TTL = 0 }),
		"TTL 25h":      bad(func(c *dlock.LeaseToken) { c.TTL = 25 * time.Hour }),
	} {
		if _, err := l.Resume(ctx, b); !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Errorf("%s: Resume = %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := l.Resume(ctx, tok, dlock.WithMaxHold(-1)); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("negative max hold: %v, want ErrInvalidArgument", err)
	}
	wrong := tok
	wrong.Fence++
	if _, err := l.Resume(ctx, wrong); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Errorf("wrong fence: %v, want ErrLeaseLost", err)
	}
	if ls.Err() != nil {
		t.Fatalf("the grant's lease ended after a wrong-fence Resume: %v", ls.Err())
	}

	plain := dlock.New(plainDriver{memdriver.New(store)}, dlock.WithStoreName("zk"))
	defer plain.Close()
	_, err = plain.Resume(ctx, tok)
	if !errors.Is(err, dlock.ErrUnsupported) || !strings.Contains(err.Error(), "zk") {
		t.Errorf("Resume on a driver without Resumer = %v, want ErrUnsupported naming the store", err)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Resume(cctx, tok); !errors.Is(err, context.Canceled) {
		t.Errorf("Resume with an ended ctx = %v, want context.Canceled", err)
	}
	closed := dlock.New(memdriver.New(store))
	closed.Close()
	if _, err := closed.Resume(ctx, tok); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Resume on a closed Locker = %v, want ErrClosed", err)
	}
	if ls.Err() != nil {
		t.Fatalf("the grant's lease ended: %v", ls.Err())
	}
}

// TestResume_DegradedTokenRefused: a degraded lease has no grant: its
// token (fence 0) is refused as invalid.
func TestResume_DegradedTokenRefused(t *testing.T) {
	store := memdriver.NewStore()
	store.SetDown(true)
	l := dlock.New(memdriver.New(store))
	defer l.Close()
	ls, err := l.TryAcquire(t.Context(), "k", dlock.WithFailOpen())
	if err != nil || !ls.Degraded() {
		t.Fatalf("degraded TryAcquire: %v", err)
	}
	store.SetDown(false)
	if _, err := l.Resume(t.Context(), ls.Token()); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("Resume of a degraded lease's token = %v, want ErrInvalidArgument", err)
	}
	_ = ls.Release(t.Context())
}

// TestLeaseToken_JSON: a token round-trips through JSON (TTL as a duration
// string); malformed JSON or fields are ErrInvalidArgument and leave the
// target unchanged.
func TestLeaseToken_JSON(t *testing.T) {
	tok := dlock.LeaseToken{Key: "job/nightly ✓", Owner: "0123456789abcdef0123456789abcdef", Fence: 1<<63 + 5, TTL: 1500 * time.Millisecond}
	b, err := json.Marshal(tok)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"key":"job/nightly ✓","owner":"0123456789abcdef0123456789abcdef","fence":9223372036854775813,"ttl":"1.5s"}`; string(b) != want {
		t.Errorf("JSON %s, want %s", b, want)
	}
	var back dlock.LeaseToken
	if err := json.Unmarshal(b, &back); err != nil || back != tok {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	text, _ := tok.MarshalText()
	var viaText dlock.LeaseToken
	if err := viaText.UnmarshalText(text); err != nil || viaText != tok {
		t.Fatalf("text round trip: %+v, %v", viaText, err)
	}
	for _, in := range []string{
		``, `null x`, `[]`, `{"key":"k","owner":"0123456789abcdef","fence":1}`,
		`{"key":"k","owner":"0123456789abcdef","fence":0,"ttl":"1s"}`,
		`{"key":"k","owner":"0123456789abcdef","fence":-1,"ttl":"1s"}`,
		`{"key":"k","owner":"0123456789abcdef","fence":1,"ttl":"soon"}`,
		`{"key":"","owner":"0123456789abcdef","fence":1,"ttl":"1s"}`,
		`{"key":"k","owner":"../x","fence":1,"ttl":"1s"}`,
	} {
		got := tok
		if err := got.UnmarshalJSON([]byte(in)); !errors.Is(err, dlock.ErrInvalidArgument) || got != tok {
			t.Errorf("UnmarshalJSON(%s) = %v (token now %+v), want ErrInvalidArgument and no change", in, err, got)
		}
	}
}

// TestResume_CloseReleases: the Locker's Close ends a resumed lease as any
// other (cause ErrClosed) and releases its grant on the store.
func TestResume_CloseReleases(t *testing.T) {
	store := memdriver.NewStore()
	first := dlock.New(memdriver.New(store), dlock.WithTTL(time.Minute))
	ls, err := first.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	second := dlock.New(memdriver.New(store))
	rs, err := second.Resume(t.Context(), ls.Token())
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(rs.Context()), dlock.ErrClosed) {
		t.Errorf("resumed lease's cause after Close = %v, want ErrClosed", context.Cause(rs.Context()))
	}
	other := dlock.New(memdriver.New(store))
	defer other.Close()
	free, err := other.TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatalf("key not free after Close of the resuming Locker: %v", err)
	}
	_ = free.Release(t.Context())
	_ = first.Close() // its lease is lost by now or at its next renewal: nothing to release
}
