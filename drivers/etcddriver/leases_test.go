package etcddriver_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/etcddriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// entryKV returns the entry of r as the store has it (nil when gone).
func entryKV(t *testing.T, cli *clientv3.Client, r driver.AcquireRequest) (lease clientv3.LeaseID, createRev int64, ok bool) {
	t.Helper()
	resp, err := cli.Get(t.Context(), "/dlock/.locks/"+r.Key+"/"+r.Owner)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0, 0, false
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease), resp.Kvs[0].CreateRevision, true
}

func leaseCount(t *testing.T, cli *clientv3.Client) int {
	t.Helper()
	resp, err := cli.Leases(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Leases)
}

// TestSharedLease_OnePerTTL: a driver's grants of one TTL share one etcd
// lease, and a grant of another TTL gets a second one; releasing them
// leaves the leases to the driver (revoked at Close). Before, every grant
// had a lease of its own (20 grants: 20 leases).
func TestSharedLease_OnePerTTL(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	d := openDriver(t, e.URL())
	ctx := t.Context()
	before := leaseCount(t, cli)
	var reqs []driver.AcquireRequest
	for i := range 20 {
		r := req("share-"+string(rune('a'+i)), 5*time.Second)
		if _, err := d.TryAcquire(ctx, r); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	first, _, _ := entryKV(t, cli, reqs[0])
	for _, r := range reqs {
		if id, _, ok := entryKV(t, cli, r); !ok || id != first {
			t.Fatalf("entry of %s on lease %x (present %v), want the shared %x", r.Key, id, ok, first)
		}
	}
	if n := leaseCount(t, cli) - before; n != 1 {
		t.Fatalf("%d new etcd leases for 20 grants of one TTL, want 1", n)
	}
	other := req("share-other", 10*time.Second)
	if _, err := d.TryAcquire(ctx, other); err != nil {
		t.Fatal(err)
	}
	if id, _, _ := entryKV(t, cli, other); id == first {
		t.Fatalf("a grant of TTL 10s is on the lease of TTL 5s")
	}
	ttl, err := cli.TimeToLive(ctx, first)
	if err != nil || ttl.GrantedTTL != 5 {
		t.Fatalf("shared lease TTL = %+v, %v; want granted 5 s", ttl, err)
	}
	if n := leaseCount(t, cli) - before; n != 2 {
		t.Fatalf("%d new etcd leases for two TTLs, want 2", n)
	}
	for _, r := range append(reqs, other) {
		if err := d.Release(ctx, r.Key, r.Owner); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if n := leaseCount(t, cli) - before; n != 0 {
		t.Fatalf("%d etcd leases left after Close with nothing held, want 0", n)
	}
}

// TestSharedLease_UnrenewedGrantEndsAlone: of two grants on one shared
// lease, the one renewed stays held and the one never renewed ends about
// a lease TTL after its grant (its entry deleted, Lost closed), as it would
// on a lease of its own.
func TestSharedLease_UnrenewedGrantEndsAlone(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	d := openDriver(t, e.URL())
	ctx := t.Context()
	kept, idle := req("alone-kept", time.Second), req("alone-idle", time.Second)
	gk, err := d.TryAcquire(ctx, kept)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	gi, err := d.TryAcquire(ctx, idle)
	if err != nil {
		t.Fatal(err)
	}
	if a, _, _ := entryKV(t, cli, kept); a != func() clientv3.LeaseID { b, _, _ := entryKV(t, cli, idle); return b }() {
		t.Fatal("the two grants are not on one lease")
	}
	lostAt := time.Duration(0)
	for time.Since(start) < 3*time.Second {
		if err := d.Renew(ctx, kept.Key, kept.Owner, kept.TTL); err != nil {
			t.Fatalf("Renew of the renewed grant: %v", err)
		}
		select {
		case <-gi.Lost:
			if lostAt == 0 {
				lostAt = time.Since(start)
			}
		default:
		}
		time.Sleep(250 * time.Millisecond)
	}
	if lostAt == 0 {
		t.Fatal("the grant never renewed was not lost within 3 s (lease TTL 1 s)")
	}
	if lostAt < time.Second {
		t.Fatalf("the grant never renewed was lost after %v, before its lease TTL of 1 s", lostAt)
	}
	if _, _, ok := entryKV(t, cli, idle); ok {
		t.Fatal("the unrenewed grant's entry is still on the store")
	}
	select {
	case <-gk.Lost:
		t.Fatal("the renewed grant was lost with the other")
	default:
	}
	if _, _, ok := entryKV(t, cli, kept); !ok {
		t.Fatal("the renewed grant's entry is gone")
	}
	if err := d.Release(ctx, kept.Key, kept.Owner); err != nil {
		t.Fatal(err)
	}
}

// TestSharedLease_LostTogether: when the shared lease ends on the store
// (revoked here), every grant on it is lost at once, and the driver's next
// grant of that TTL gets a new lease.
func TestSharedLease_LostTogether(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	d := openDriver(t, e.URL())
	ctx := t.Context()
	r1, r2 := req("together-1", 5*time.Second), req("together-2", 5*time.Second)
	g1, err := d.TryAcquire(ctx, r1)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := d.TryAcquire(ctx, r2)
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := entryKV(t, cli, r1)
	if _, err := cli.Revoke(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, g := range []driver.Grant{g1, g2} {
		select {
		case <-g.Lost:
		case <-time.After(5 * time.Second):
			t.Fatal("a grant on the revoked shared lease was not lost")
		}
	}
	if err := d.Renew(ctx, r1.Key, r1.Owner, r1.TTL); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after the lease ended = %v, want ErrLeaseLost", err)
	}
	r3 := req("together-3", 5*time.Second)
	if _, err := d.TryAcquire(ctx, r3); err != nil {
		t.Fatalf("TryAcquire after the shared lease ended: %v", err)
	}
	if id3, _, _ := entryKV(t, cli, r3); id3 == id || id3 == 0 {
		t.Fatalf("new grant on lease %x, want a new lease (the old was %x)", id3, id)
	}
}

// TestSharedLease_RenewWithAnotherTTLMoves: a Renew with a TTL of another
// whole number of seconds moves the entry to the shared lease of that TTL,
// keeping its create revision (the fence), and the grant then lives by the
// new TTL.
func TestSharedLease_RenewWithAnotherTTLMoves(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	d := openDriver(t, e.URL())
	ctx := t.Context()
	r := req("move-k", time.Second)
	g, err := d.TryAcquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	oldID, rev, _ := entryKV(t, cli, r)
	if uint64(rev) != g.Fence {
		t.Fatalf("fence %d, create revision %d", g.Fence, rev)
	}
	if err := d.Renew(ctx, r.Key, r.Owner, 4*time.Second); err != nil {
		t.Fatal(err)
	}
	newID, rev2, ok := entryKV(t, cli, r)
	if !ok || rev2 != rev || newID == oldID {
		t.Fatalf("after Renew with 4s: lease %x (was %x), create revision %d (was %d), present %v", newID, oldID, rev2, rev, ok)
	}
	ttl, err := cli.TimeToLive(ctx, newID)
	if err != nil || ttl.GrantedTTL != 4 {
		t.Fatalf("new lease %+v, %v; want granted 4 s", ttl, err)
	}
	// Unrenewed past the old TTL (1 s) but within the new one (4 s): held.
	time.Sleep(2 * time.Second)
	select {
	case <-g.Lost:
		t.Fatal("the moved grant was lost by its old TTL")
	default:
	}
	if err := d.Renew(ctx, r.Key, r.Owner, 4*time.Second); err != nil {
		t.Fatalf("Renew with the new TTL: %v", err)
	}
	info, err := d.Inspect(ctx, r.Key)
	if err != nil || info.Fence != g.Fence || info.TTL != 4*time.Second {
		t.Fatalf("Inspect = %+v, %v; want fence %d, TTL 4s", info, err, g.Fence)
	}
	if err := d.Release(ctx, r.Key, r.Owner); err != nil {
		t.Fatal(err)
	}
}

// TestSharedLease_FailedReleaseStillEnds: a grant whose Release could not
// reach the store (here: its ctx already cancelled) ends on the store about
// a lease TTL later, as it did on a lease of its own, even while another
// grant keeps the shared lease alive; it is not left held for as long as
// the driver holds anything else of that TTL.
func TestSharedLease_FailedReleaseStillEnds(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	d := openDriver(t, e.URL())
	ctx := t.Context()
	kept, failed := req("failrel-kept", time.Second), req("failrel-failed", time.Second)
	if _, err := d.TryAcquire(ctx, kept); err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, failed); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := d.Release(cctx, failed.Key, failed.Owner); err == nil {
		t.Fatal("Release with a cancelled ctx succeeded; the test needs it to fail")
	}
	start := time.Now()
	for time.Since(start) < 4*time.Second {
		if err := d.Renew(ctx, kept.Key, kept.Owner, kept.TTL); err != nil {
			t.Fatalf("Renew of the renewed grant: %v", err)
		}
		if _, _, ok := entryKV(t, cli, failed); !ok {
			t.Logf("the entry whose release failed ended %v later", time.Since(start))
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatal("the entry whose Release failed is still on the store 4 s later (lease TTL 1 s): the shared lease's keepalive keeps it held")
}

// onExpiring runs f once in a shared lease's loop, after the loop marked
// expired grants and before it deletes their entries, and sends f's error
// on the channel it returns. The hook is removed when the test ends.
func onExpiring(t *testing.T, f func() error) <-chan error {
	got := make(chan error, 1)
	var once sync.Once
	t.Cleanup(etcddriver.SetTestHookExpiring(func() { once.Do(func() { got <- f() }) }))
	return got
}

// TestSharedLease_RenewRacingExpiryIsLost: a renewal in flight while the
// shared lease's loop deletes the entry of a grant past its deadline never
// reports success. Before, the renewal could read the entry just before the
// loop's delete, answer nil and extend the deadline of a grant whose entry
// was then deleted (another client could take the key while its holder
// believed it renewed). The loop's pass is held at the point between
// marking the grant expired and deleting its entry, and Renew runs there.
func TestSharedLease_RenewRacingExpiryIsLost(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	d := openDriver(t, e.URL())
	ctx := t.Context()
	r := req("expiry-race", time.Second)

	renewed := onExpiring(t, func() error {
		// The entry is still on the store here: the loop has not
		// deleted it yet.
		if _, _, ok := entryKV(t, cli, r); !ok {
			return errors.New("the entry was gone before the loop deleted it")
		}
		return d.Renew(ctx, r.Key, r.Owner, r.TTL)
	})

	g, err := d.TryAcquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	var rerr error
	select {
	case rerr = <-renewed:
	case <-time.After(5 * time.Second):
		t.Fatal("the lease's loop did not expire the unrenewed grant within 5 s (TTL 1 s)")
	}
	if rerr == nil {
		t.Fatal("Renew racing the loop's delete of the expired entry answered nil")
	}
	if !errors.Is(rerr, driver.ErrLeaseLost) {
		t.Fatalf("Renew racing the loop's delete = %v, want ErrLeaseLost", rerr)
	}
	select {
	case <-g.Lost:
	case <-time.After(5 * time.Second):
		t.Fatal("the expired grant was not reported lost within 5 s")
	}
	if _, _, ok := entryKV(t, cli, r); ok {
		t.Fatal("the expired grant's entry is still on the store")
	}
	if err := d.Renew(ctx, r.Key, r.Owner, r.TTL); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after the expiry = %v, want ErrLeaseLost", err)
	}
	// The key is free for another owner, with a greater fence.
	r2 := req("expiry-race", time.Second)
	g2, err := d.TryAcquire(ctx, r2)
	if err != nil || g2.Fence <= g.Fence {
		t.Fatalf("TryAcquire after the expiry = %+v, %v; want a grant with fence > %d", g2, err, g.Fence)
	}
	if err := d.Release(ctx, r2.Key, r2.Owner); err != nil {
		t.Fatal(err)
	}
}

// TestSharedLease_ResumeRacingExpiryIsLost: a Resume by the same driver,
// with another TTL, of a grant that the shared lease's loop is deleting
// moves the entry to another lease, where the loop's delete (conditioned
// on the old lease) cannot reach it. It must not answer success, and the
// moved entry must still end: before, Resume answered nil, the grant was
// then reported lost, and its entry stayed on etcd for good, kept alive by
// the other grants of the new lease, so nobody could take the key.
func TestSharedLease_ResumeRacingExpiryIsLost(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	d := openDriver(t, e.URL())
	ctx := t.Context()
	r := req("resume-race", 2*time.Second)
	// Another grant keeps the 1 s lease alive while the test runs.
	keep := req("resume-race-keep", time.Second)
	if _, err := d.TryAcquire(ctx, keep); err != nil {
		t.Fatal(err)
	}
	stopKeep := make(chan struct{})
	keepDone := make(chan struct{})
	go func() {
		defer close(keepDone)
		for {
			select {
			case <-stopKeep:
				return
			case <-time.After(200 * time.Millisecond):
				_ = d.Renew(ctx, keep.Key, keep.Owner, keep.TTL)
			}
		}
	}()
	defer func() { close(stopKeep); <-keepDone }()

	g, err := d.TryAcquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	resumed := onExpiring(t, func() error {
		moved := r
		moved.TTL = time.Second
		_, err := d.Resume(ctx, moved, g.Fence)
		return err
	})

	var rerr error
	select {
	case rerr = <-resumed:
	case <-time.After(10 * time.Second):
		t.Fatal("the lease's loop did not expire the unrenewed grant within 10 s (TTL 2 s)")
	}
	if !errors.Is(rerr, driver.ErrLeaseLost) {
		t.Fatalf("Resume racing the loop's delete = %v, want ErrLeaseLost", rerr)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, _, ok := entryKV(t, cli, r); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the entry moved by the racing Resume is still on etcd 10 s later (its new lease is kept alive): the key is held by nobody for good")
		}
		time.Sleep(50 * time.Millisecond)
	}
	r2 := req("resume-race", time.Second)
	if _, err := d.TryAcquire(ctx, r2); err != nil {
		t.Fatalf("TryAcquire after the expiry: %v", err)
	}
}

// TestSharedLease_RepeatWithLongerTTLKeepsTheGrant: a repeated acquire by
// the same owner with a longer TTL moves the entry to that TTL's lease and
// confirms it for a TTL from then. Before, the grant kept the deadline of
// its first, shorter TTL, and the new lease's loop deleted the entry at its
// first tick: a false loss before the holder's first renewal was due.
func TestSharedLease_RepeatWithLongerTTLKeepsTheGrant(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	d := openDriver(t, e.URL())
	ctx := t.Context()
	r := req("repeat-longer", time.Second)
	g, err := d.TryAcquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	longer := r
	longer.TTL = 4 * time.Second
	g2, err := d.TryAcquire(ctx, longer)
	if err != nil || g2.Fence != g.Fence {
		t.Fatalf("repeat with a longer TTL = %+v, %v; want the same grant (fence %d)", g2, err, g.Fence)
	}
	// Past the first TTL's deadline and a few ticks of the longer lease's
	// loop (every 4/3 s), with no renewal: still held.
	select {
	case <-g2.Lost:
		t.Fatal("the grant repeated with a 4 s TTL was lost within 3 s, unrenewed")
	case <-time.After(3 * time.Second):
	}
	if _, _, ok := entryKV(t, cli, r); !ok {
		t.Fatal("the entry of the grant repeated with a 4 s TTL is gone after 3 s")
	}
	if err := d.Release(ctx, r.Key, r.Owner); err != nil {
		t.Fatal(err)
	}
}

// TestSharedLease_GrantOnStaleLeaseLivesItsTTL: a grant put on a shared
// lease whose keepalives have stalled (its last confirmation most of a TTL
// old) still lives a full TTL from its request on the store, because the
// acquisition confirms a keepalive sent after it began. Before, the entry
// ended with the stale lease, here about 0.5 s after the grant of a 2 s
// TTL, while its holder counted on it for 2 s: dlock verify found the
// next holder granted early under reply loss and a paused etcd leader.
func TestSharedLease_GrantOnStaleLeaseLivesItsTTL(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	d := openDriver(t, e.URL())
	ctx := t.Context()
	t.Cleanup(etcddriver.SetTestHookNoLoopKeepAlive(true))
	const ttl = 2 * time.Second
	if _, err := d.TryAcquire(ctx, req("stale-first", ttl)); err != nil {
		t.Fatal(err) // grants the shared lease
	}
	time.Sleep(ttl * 3 / 4) // no keepalive meanwhile: a quarter of the lease is left
	r := req("stale-second", ttl)
	sent := time.Now()
	if _, err := d.TryAcquire(ctx, r); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(sent.Add(ttl * 3 / 4)))
	if _, _, ok := entryKV(t, cli, r); !ok {
		t.Fatalf("the grant's entry was gone %v after its request (TTL %v): it ended with the stale shared lease", time.Since(sent).Round(time.Millisecond), ttl)
	}
}

// TestSharedLease_GrantOnAFreshLeaseSendsNoKeepAlive: a TryAcquire on a
// shared lease whose last confirmed keepalive leaves at least 3/5 of a TTL
// sends no keepalive of its own (one round trip fewer beside the put) and
// says how long the store keeps the grant (Grant.ValidFor: the lease's TTL
// from that keepalive, less than the TTL from the request), and the entry
// lives that long; a grant on a lease just granted lives its TTL
// (ValidFor 0). Before, every acquisition on a lease granted earlier
// waited for a keepalive sent after it began.
func TestSharedLease_GrantOnAFreshLeaseSendsNoKeepAlive(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	d := openDriver(t, e.URL())
	ctx := t.Context()
	t.Cleanup(etcddriver.SetTestHookNoLoopKeepAlive(true))
	const ttl = 6 * time.Second
	first := req("fresh-first", ttl)
	g, err := d.TryAcquire(ctx, first)
	if err != nil {
		t.Fatal(err) // grants the shared lease
	}
	if g.ValidFor != 0 {
		t.Fatalf("the grant that made the lease has ValidFor %v, want 0 (a TTL from its request)", g.ValidFor)
	}
	lease, _, _ := entryKV(t, cli, first)
	time.Sleep(2 * time.Second) // no keepalive meanwhile: about 4 s of the lease left
	r := req("fresh-second", ttl)
	sent := time.Now()
	g, err = d.TryAcquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if g.ValidFor < ttl*3/5 || g.ValidFor > ttl-2*time.Second {
		t.Fatalf("ValidFor %v, want what the lease had left, about %v", g.ValidFor, ttl-2*time.Second)
	}
	ttlResp, err := cli.TimeToLive(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	if ttlResp.TTL > 4 {
		t.Fatalf("the shared lease has %d s left after the grant, want at most 4: a keepalive was sent", ttlResp.TTL)
	}
	time.Sleep(time.Until(sent.Add(g.ValidFor - 300*time.Millisecond)))
	if _, _, ok := entryKV(t, cli, r); !ok {
		t.Fatalf("the grant's entry was gone %v after its request, before its ValidFor %v", time.Since(sent).Round(time.Millisecond), g.ValidFor)
	}
	for _, r := range []driver.AcquireRequest{first, r} {
		if err := d.Release(ctx, r.Key, r.Owner); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSharedLease_ClientCountsTheShorterValidity: through the dlock
// client, a grant made without a keepalive is valid only as long as etcd
// keeps its entry (the shared lease's TTL from its last keepalive), not a
// TTL from the request, until the lease's first renewal, which comes a
// third of the way in and restores a full TTL.
func TestSharedLease_ClientCountsTheShorterValidity(t *testing.T) {
	e := testservers.StartEtcd(t)
	d := openDriver(t, e.URL())
	l := dlock.New(d)
	defer l.Close()
	ctx := t.Context()
	t.Cleanup(etcddriver.SetTestHookNoLoopKeepAlive(true))
	const ttl = 6 * time.Second
	// The first grant is made through the driver alone: a lease of the
	// client would renew it at TTL/3 = 2 s, a keepalive of the shared lease.
	first := req("client-first", ttl)
	if _, err := d.TryAcquire(ctx, first); err != nil {
		t.Fatal(err) // grants the shared lease: a full TTL
	}
	time.Sleep(2 * time.Second) // no keepalive meanwhile: about 4 s of the lease left
	sent := time.Now()
	ls, err := l.TryAcquire(ctx, "client-second", dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if left := ls.Deadline().Sub(sent); left > ttl-2*time.Second || left < ttl*3/5-100*time.Millisecond {
		t.Fatalf("the lease is valid %v from its request, want what the shared lease had left (about %v), not the TTL", left, ttl-2*time.Second)
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Until(ls.Deadline()) < ttl-time.Second && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := time.Until(ls.Deadline()); left < ttl-time.Second {
		t.Fatalf("validity left %v %v after the grant, want a full TTL after its first renewal (due at about 1.3 s)", left, time.Since(sent).Round(time.Millisecond))
	}
	if err := ls.Err(); err != nil {
		t.Fatalf("lease ended: %v", err)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, first.Key, first.Owner); err != nil {
		t.Fatal(err)
	}
}
