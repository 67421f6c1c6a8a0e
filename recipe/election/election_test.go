package election_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/memdriver"
	"github.com/dlock-dev/dlock/recipe/election"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// memLockers returns n Lockers on one in-process store, each over its own
// driver wrapped in a FaultDriver: n processes sharing a store.
func memLockers(t *testing.T, n int, opts ...dlock.Option) ([]*dlock.Locker, []*dlocktest.FaultDriver) {
	t.Helper()
	st := memdriver.NewStore()
	var ls []*dlock.Locker
	var fs []*dlocktest.FaultDriver
	for range n {
		fd := dlocktest.NewFaultDriver(memdriver.New(st), nil)
		base := []dlock.Option{dlock.WithStoreName("mem"), dlock.WithBackoff(time.Millisecond, 20*time.Millisecond)}
		l := dlock.New(fd, append(base, opts...)...)
		t.Cleanup(func() { _ = l.Close() })
		ls = append(ls, l)
		fs = append(fs, dlocktest.Faults(fd))
	}
	return ls, fs
}

func TestCampaign_TermsIncreaseAndValueIsShown(t *testing.T) {
	ls, _ := memLockers(t, 2)
	ctx := t.Context()
	var last uint64
	for i := range 6 {
		l := ls[i%2]
		value := fmt.Sprintf("node-%d", i%2)
		lead, err := election.Campaign(ctx, l, "jobs-leader", value, dlock.WithTTL(5*time.Second))
		if err != nil {
			t.Fatalf("round %d: Campaign: %v", i, err)
		}
		if lead.Term() <= last {
			t.Fatalf("round %d: term %d not greater than %d", i, lead.Term(), last)
		}
		last = lead.Term()
		if lead.Value() != value || lead.Name() != "jobs-leader" || lead.Err() != nil {
			t.Fatalf("round %d: value %q name %q err %v", i, lead.Value(), lead.Name(), lead.Err())
		}
		got, err := election.Leader(ctx, ls[(i+1)%2], "jobs-leader")
		if err != nil {
			t.Fatalf("Leader: %v", err)
		}
		if got != (election.LeaderInfo{Value: value, Term: lead.Term()}) {
			t.Fatalf("Leader = %+v, want %q term %d", got, value, lead.Term())
		}
		info, err := l.Inspect(ctx, "jobs-leader")
		if err != nil || info.Holder != value {
			t.Fatalf("Inspect: holder %q err %v, want the value as holder", info.Holder, err)
		}
		if err := lead.Resign(ctx); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		if !errors.Is(lead.Err(), dlock.ErrReleased) || !errors.Is(context.Cause(lead.Context()), dlock.ErrReleased) {
			t.Fatalf("after Resign: Err %v, cause %v", lead.Err(), context.Cause(lead.Context()))
		}
		select {
		case <-lead.Done():
		default:
			t.Fatal("Done open after Resign")
		}
	}
	_, err := election.Leader(ctx, ls[0], "jobs-leader")
	if !errors.Is(err, election.ErrNoLeader) || !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("Leader with nobody leading = %v, want ErrNoLeader and ErrNotAcquired", err)
	}
}

func TestCampaign_WaitsForLeaderToResign(t *testing.T) {
	ls, _ := memLockers(t, 2)
	ctx := t.Context()
	a, err := election.Campaign(ctx, ls[0], "e", "a", dlock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	won := make(chan *election.Leadership, 1)
	errc := make(chan error, 1)
	go func() {
		b, err := election.Campaign(ctx, ls[1], "e", "b", dlock.WithTTL(5*time.Second))
		if err != nil {
			errc <- err
			return
		}
		won <- b
	}()
	select {
	case b := <-won:
		t.Fatalf("b won (term %d) while a leads", b.Term())
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-won:
		if b.Term() <= a.Term() {
			t.Fatalf("b's term %d not greater than a's %d", b.Term(), a.Term())
		}
		_ = b.Resign(ctx)
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("b did not win after a resigned")
	}
	// A second Resign reports the first one's result.
	if err := a.Resign(ctx); err != nil {
		t.Fatalf("second Resign = %v", err)
	}
}

func TestCampaign_CancelLeavesNothing(t *testing.T) {
	ls, _ := memLockers(t, 2)
	a, err := election.Campaign(t.Context(), ls[0], "e", "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = election.Campaign(ctx, ls[1], "e", "b")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Campaign with a short ctx = %v, want DeadlineExceeded", err)
	}
	if err := a.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := election.Leader(t.Context(), ls[0], "e"); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("after the leader resigned and the other campaigner gave up: Leader = %v, want ErrNoLeader", err)
	}
}

func TestCampaign_InvalidInput(t *testing.T) {
	ls, _ := memLockers(t, 1)
	ctx := t.Context()
	cases := []struct {
		name, election, value string
		want                  error
	}{
		{"empty name", "", "v", dlock.ErrInvalidKey},
		{"NUL in name", "a\x00b", "v", dlock.ErrInvalidKey},
		{"long name", strings.Repeat("n", dlock.MaxKeyBytes+1), "v", dlock.ErrInvalidKey},
		{"long value", "e", strings.Repeat("v", election.MaxValueBytes+1), dlock.ErrInvalidHolder},
		{"newline in value", "e", "a\nb", dlock.ErrInvalidHolder},
		{"invalid UTF-8 value", "e", "\xff", dlock.ErrInvalidHolder},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := election.Campaign(ctx, ls[0], c.election, c.value)
			if !errors.Is(err, c.want) || !errors.Is(err, dlock.ErrInvalidArgument) {
				t.Fatalf("Campaign = %v, want %v (ErrInvalidArgument)", err, c.want)
			}
		})
	}
	if _, err := election.Campaign(ctx, ls[0], "e", "v", dlock.WithTTL(time.Millisecond)); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Fatalf("Campaign with a 1 ms TTL = %v, want ErrInvalidTTL", err)
	}
	if _, err := election.Campaign(ctx, nil, "e", "v"); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("Campaign(nil locker) = %v, want ErrInvalidArgument", err)
	}
	if _, err := election.Leader(ctx, nil, "e"); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("Leader(nil locker) = %v, want ErrInvalidArgument", err)
	}
	if _, err := election.Leader(ctx, ls[0], ""); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("Leader(\"\") = %v, want ErrInvalidKey", err)
	}
	if _, err := election.Observe(ctx, ls[0], ""); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("Observe(\"\") = %v, want ErrInvalidKey", err)
	}
	if _, err := election.Observe(ctx, ls[0], "e", election.WithPollInterval(time.Microsecond)); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("Observe with a 1 µs poll = %v, want ErrInvalidArgument", err)
	}
	if _, err := election.Observe(ctx, nil, "e"); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("Observe(nil locker) = %v, want ErrInvalidArgument", err)
	}
}

// bare hides every optional capability of a driver (Inspector included).
type bare struct{ driver.Driver }

func TestLeaderObserve_UnsupportedWithoutInspector(t *testing.T) {
	l := dlock.New(bare{memdriver.New(memdriver.NewStore())}, dlock.WithStoreName("bare"))
	t.Cleanup(func() { _ = l.Close() })
	lead, err := election.Campaign(t.Context(), l, "e", "v")
	if err != nil {
		t.Fatalf("Campaign needs no Inspector: %v", err)
	}
	defer lead.Resign(t.Context())
	if _, err := election.Leader(t.Context(), l, "e"); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("Leader = %v, want ErrUnsupported", err)
	}
	if _, err := election.Observe(t.Context(), l, "e"); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("Observe = %v, want ErrUnsupported", err)
	}
}

func TestCampaign_ClosedLocker(t *testing.T) {
	ls, _ := memLockers(t, 1)
	_ = ls[0].Close()
	if _, err := election.Campaign(t.Context(), ls[0], "e", "v"); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Campaign on a closed Locker = %v, want ErrClosed", err)
	}
}

func TestLeadership_EndsWhenLockerCloses(t *testing.T) {
	ls, _ := memLockers(t, 1)
	lead, err := election.Campaign(t.Context(), ls[0], "e", "v")
	if err != nil {
		t.Fatal(err)
	}
	_ = ls[0].Close()
	select {
	case <-lead.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done open after Close")
	}
	if !errors.Is(lead.Err(), dlock.ErrClosed) {
		t.Fatalf("Err = %v, want ErrClosed", lead.Err())
	}
}

// nextLeader reads ch until it delivers want (other values may come first:
// the channel keeps the latest only), or fails after limit.
func nextLeader(t *testing.T, ch <-chan election.LeaderInfo, want election.LeaderInfo, limit time.Duration) {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	var seen []election.LeaderInfo
	for {
		select {
		case got, ok := <-ch:
			if !ok {
				t.Fatalf("Observe channel closed while waiting for %+v (seen %+v)", want, seen)
			}
			seen = append(seen, got)
			if got == want {
				return
			}
		case <-timer.C:
			t.Fatalf("Observe did not deliver %+v within %v (seen %+v)", want, limit, seen)
		}
	}
}

func TestObserve_Polling(t *testing.T) {
	ls, _ := memLockers(t, 2)
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := election.Observe(ctx, ls[1], "e", election.WithPollInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	nextLeader(t, ch, election.LeaderInfo{}, 5*time.Second) // nobody leads yet
	var terms []uint64
	for i := range 3 {
		lead, err := election.Campaign(ctx, ls[i%2], "e", fmt.Sprintf("v%d", i))
		if err != nil {
			t.Fatal(err)
		}
		nextLeader(t, ch, election.LeaderInfo{Value: fmt.Sprintf("v%d", i), Term: lead.Term()}, 5*time.Second)
		terms = append(terms, lead.Term())
		if err := lead.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		nextLeader(t, ch, election.LeaderInfo{}, 5*time.Second)
	}
	cancel()
	for range ch { // closed once ctx ends
	}
	t.Logf("observed terms %v", terms)
}

// pushing is a mem driver that is also a driver.KeyWatcher: every grant and
// release made through any pushing driver of the same hub notifies the
// watchers of the key. It stands in for a store's watch, so that the push
// path of Observe is tested without a server (etcd and ZooKeeper have their
// own tests against real servers).
type pushing struct {
	*memdriver.Driver
	hub *watchHub
}

type watchHub struct {
	mu      sync.Mutex
	watches map[string]map[chan struct{}]struct{}
	started int
}

func (h *watchHub) notify(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.watches[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (p pushing) WatchKey(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := driver.CheckKey(key); err != nil {
		return nil, err
	}
	ch := make(chan struct{}, 1)
	h := p.hub
	h.mu.Lock()
	if h.watches == nil {
		h.watches = map[string]map[chan struct{}]struct{}{}
	}
	if h.watches[key] == nil {
		h.watches[key] = map[chan struct{}]struct{}{}
	}
	h.watches[key][ch] = struct{}{}
	h.started++
	h.mu.Unlock()
	context.AfterFunc(ctx, func() {
		h.mu.Lock()
		if _, ok := h.watches[key][ch]; ok { // not broken meanwhile
			delete(h.watches[key], ch)
			close(ch)
		}
		h.mu.Unlock()
	})
	return ch, nil
}

func (p pushing) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := p.Driver.TryAcquire(ctx, req)
	p.hub.notify(req.Key)
	return g, err
}

func (p pushing) Wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := p.Driver.Wait(ctx, req)
	p.hub.notify(req.Key)
	return g, err
}

func (p pushing) Release(ctx context.Context, key, owner string) error {
	err := p.Driver.Release(ctx, key, owner)
	p.hub.notify(key)
	return err
}

var _ driver.KeyWatcher = pushing{}

func TestObserve_PushedWithoutPolling(t *testing.T) {
	st, hub := memdriver.NewStore(), &watchHub{}
	var ls []*dlock.Locker
	for range 2 {
		l := dlock.New(pushing{memdriver.New(st), hub})
		t.Cleanup(func() { _ = l.Close() })
		ls = append(ls, l)
	}
	ctx, cancel := context.WithCancel(t.Context())
	// A poll interval far longer than the test: only the watch can
	// deliver in time.
	ch, err := election.Observe(ctx, ls[1], "e", election.WithPollInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	nextLeader(t, ch, election.LeaderInfo{}, 5*time.Second)
	for i := range 5 {
		lead, err := election.Campaign(ctx, ls[i%2], "e", fmt.Sprintf("v%d", i))
		if err != nil {
			t.Fatal(err)
		}
		nextLeader(t, ch, election.LeaderInfo{Value: fmt.Sprintf("v%d", i), Term: lead.Term()}, 5*time.Second)
		if err := lead.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		nextLeader(t, ch, election.LeaderInfo{}, 5*time.Second)
	}
	cancel()
	for range ch {
	}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	if hub.started != 1 {
		t.Errorf("%d watches started, want 1 (the watch never broke)", hub.started)
	}
	if n := len(hub.watches["e"]); n != 0 {
		t.Errorf("%d watches left after ctx ended", n)
	}
}

func TestObserve_EndsWhenLockerCloses(t *testing.T) {
	ls, _ := memLockers(t, 1)
	ch, err := election.Observe(t.Context(), ls[0], "e", election.WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-ch
	_ = ls[0].Close()
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timer.C:
			t.Fatal("Observe channel open 5 s after the Locker closed")
		}
	}
}

func TestObserve_StoreErrorsAreRetried(t *testing.T) {
	ls, fs := memLockers(t, 2)
	ch, err := election.Observe(t.Context(), ls[1], "e", election.WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	nextLeader(t, ch, election.LeaderInfo{}, 5*time.Second)
	fs[1].CutOff(true)
	lead, err := election.Campaign(t.Context(), ls[0], "e", "a")
	if err != nil {
		t.Fatal(err)
	}
	defer lead.Resign(t.Context())
	time.Sleep(50 * time.Millisecond) // a few failed reads
	fs[1].CutOff(false)
	nextLeader(t, ch, election.LeaderInfo{Value: "a", Term: lead.Term()}, 5*time.Second)

	fs[1].CutOff(true)
	defer fs[1].CutOff(false)
	if _, err := election.Observe(t.Context(), ls[1], "e"); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Observe on a cut-off store = %v, want ErrUnavailable at once", err)
	}
}

// hinting is a mem driver that is also a driver.Hinter: each release made
// through a hinting driver of the same hub hints the key's subscribers, as
// Redis's pub/sub release hints do. It is no Waiter and no KeyWatcher.
type hinting struct {
	bare
	inspect driver.Inspector
	hub     *watchHub
}

func (h hinting) Inspect(ctx context.Context, key string) (driver.HolderInfo, error) {
	return h.inspect.Inspect(ctx, key)
}

func (h hinting) List(ctx context.Context, prefix string) ([]driver.HolderInfo, error) {
	return h.inspect.List(ctx, prefix)
}

func (h hinting) Hint(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	ch, err := pushing{hub: h.hub}.WatchKey(ctx, key)
	return ch, func() {}, err
}

func (h hinting) Release(ctx context.Context, key, owner string) error {
	err := h.bare.Release(ctx, key, owner)
	h.hub.notify(key)
	return err
}

func TestObserve_ReleaseHintWakesThePoll(t *testing.T) {
	st, hub := memdriver.NewStore(), &watchHub{}
	var ls []*dlock.Locker
	for range 2 {
		md := memdriver.New(st)
		l := dlock.New(hinting{bare{md}, md, hub})
		t.Cleanup(func() { _ = l.Close() })
		ls = append(ls, l)
	}
	lead, err := election.Campaign(t.Context(), ls[0], "e", "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	// Polls far apart: only the hint can deliver the resignation in time.
	ch, err := election.Observe(ctx, ls[1], "e", election.WithPollInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	nextLeader(t, ch, election.LeaderInfo{Value: "a", Term: lead.Term()}, 5*time.Second)
	if err := lead.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	nextLeader(t, ch, election.LeaderInfo{}, 5*time.Second)
	cancel()
	for range ch {
	}
}

// breakAll ends every watch of the hub, as a store that drops its watch
// streams would.
func (h *watchHub) breakAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for key, chans := range h.watches {
		for ch := range chans {
			close(ch)
		}
		delete(h.watches, key)
	}
}

func TestObserve_WatchBrokenIsSetUpAgain(t *testing.T) {
	st, hub := memdriver.NewStore(), &watchHub{}
	var ls []*dlock.Locker
	for range 2 {
		l := dlock.New(pushing{memdriver.New(st), hub})
		t.Cleanup(func() { _ = l.Close() })
		ls = append(ls, l)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := election.Observe(ctx, ls[1], "e", election.WithPollInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	nextLeader(t, ch, election.LeaderInfo{}, 5*time.Second)
	for round := range 3 {
		hub.breakAll()
		// Set up again within about one poll interval.
		deadline := time.Now().Add(5 * time.Second)
		for {
			hub.mu.Lock()
			n, started := len(hub.watches["e"]), hub.started
			hub.mu.Unlock()
			if n == 1 && started == round+2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d watches in place, %d started, 5 s after the break", round, n, started)
			}
			time.Sleep(5 * time.Millisecond)
		}
		lead, err := election.Campaign(ctx, ls[0], "e", "a")
		if err != nil {
			t.Fatal(err)
		}
		nextLeader(t, ch, election.LeaderInfo{Value: "a", Term: lead.Term()}, 5*time.Second)
		if err := lead.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		nextLeader(t, ch, election.LeaderInfo{}, 5*time.Second)
	}
	cancel()
	for range ch {
	}
}
