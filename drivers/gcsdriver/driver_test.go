package gcsdriver_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/gcsdriver"
	"github.com/dlock-dev/dlock/internal/cli"
	"github.com/dlock-dev/dlock/internal/netproxy"
	"github.com/dlock-dev/dlock/internal/testservers/gcsfake"
)

const (
	ownerA = "owner-a-0123456789abcdef0123456789"
	ownerB = "owner-b-0123456789abcdef0123456789"
	ownerC = "owner-c-0123456789abcdef0123456789"
)

// open opens a driver on the fake by URL, closed in t.Cleanup.
func open(t *testing.T, fake *gcsfake.Server) *gcsdriver.Driver {
	t.Helper()
	d, err := gcsdriver.Open(t.Context(), fake.URL(bucket, "locks"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// client returns a Cloud Storage client of the fake, for the tests that
// check the fake itself.
func client(t *testing.T, fake *gcsfake.Server) *storage.Client {
	t.Helper()
	c, err := storage.NewClient(t.Context(), option.WithEndpoint(fake.Endpoint()+"/storage/v1/"),
		option.WithoutAuthentication(), storage.WithDisabledClientMetrics())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func req(key, owner string, ttl time.Duration) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl, Holder: "test " + owner[:7]}
}

func mustGrant(t *testing.T, d driver.Driver, r driver.AcquireRequest) driver.Grant {
	t.Helper()
	g, err := d.TryAcquire(t.Context(), r)
	if err != nil {
		t.Fatalf("TryAcquire(%q, %s): %v", r.Key, r.Owner, err)
	}
	if g.Fence == 0 {
		t.Fatal("fence 0")
	}
	return g
}

// record reads key's record object ("locks/" + key, for keys that need no
// escaping) straight from the fake.
func record(t *testing.T, fake *gcsfake.Server, key string) fakestorage.ObjectAttrs {
	t.Helper()
	a, err := fake.Object(bucket, "locks/"+key)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func status(err error) int {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return ge.Code
	}
	return 0
}

// TestFake_Preconditions pins down what the test server, fake-gcs-server
// v1.56.1, enforces, since the driver's safety rests on it: a write's
// ifGenerationMatch (0 and a generation) is enforced, and is all the
// driver uses. The preconditions of metadata updates and deletes are not
// enforced and metageneration never moves, which is why the driver does
// not use them (see the package doc); if an upgrade of the fake changes
// that, this test says so, and the package doc must be revisited.
func TestFake_Preconditions(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	obj := client(t, fake).Bucket(bucket).Object("probe")
	ctx := t.Context()
	put := func(cond storage.Conditions, body string) (*storage.ObjectAttrs, error) {
		w := obj.If(cond).NewWriter(ctx)
		w.ChunkSize = 0
		_, _ = w.Write([]byte(body))
		if err := w.Close(); err != nil {
			return nil, err
		}
		return w.Attrs(), nil
	}
	first, err := put(storage.Conditions{DoesNotExist: true}, "1")
	if err != nil {
		t.Fatalf("create with ifGenerationMatch=0: %v", err)
	}
	if _, err := put(storage.Conditions{DoesNotExist: true}, "2"); status(err) != http.StatusPreconditionFailed {
		t.Fatalf("second create with ifGenerationMatch=0 = %v, want 412 (enforced)", err)
	}
	if _, err := put(storage.Conditions{GenerationMatch: first.Generation + 1}, "3"); status(err) != http.StatusPreconditionFailed {
		t.Fatalf("write with a wrong ifGenerationMatch = %v, want 412 (enforced)", err)
	}
	second, err := put(storage.Conditions{GenerationMatch: first.Generation}, "4")
	if err != nil {
		t.Fatalf("write with the right ifGenerationMatch: %v", err)
	}
	if second.Generation == first.Generation {
		t.Fatalf("a write kept the generation %d", first.Generation)
	}
	if a, err := obj.Attrs(ctx); err != nil || a.Generation != second.Generation {
		t.Fatalf("object after the writes: %+v, %v", a, err)
	}

	// Not enforced: a metadata update with wrong preconditions succeeds,
	// and metageneration does not move.
	before, err := obj.Attrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = obj.If(storage.Conditions{GenerationMatch: second.Generation + 1, MetagenerationMatch: before.Metageneration + 41}).
		Update(ctx, storage.ObjectAttrsToUpdate{Metadata: map[string]string{"x": "1"}})
	if err == nil {
		t.Logf("fake-gcs-server ignores ifGenerationMatch and ifMetagenerationMatch on a metadata update (the driver does not use updates)")
	} else {
		t.Errorf("metadata update with wrong preconditions = %v: the fake now enforces them; revisit the package doc", err)
	}
	after, err := obj.Attrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Metadata["x"] != "1" {
		t.Fatalf("the update was not applied: %v", after.Metadata)
	}
	if after.Metageneration > before.Metageneration {
		t.Errorf("metageneration %d -> %d after an update: the fake now tracks it; revisit the package doc", before.Metageneration, after.Metageneration)
	} else {
		t.Logf("metageneration %d before and %d after a metadata update: the fake does not track it", before.Metageneration, after.Metageneration)
	}
	// Not enforced either: a delete's ifGenerationMatch.
	if err := obj.If(storage.Conditions{GenerationMatch: second.Generation + 1}).Delete(ctx); err == nil {
		t.Logf("fake-gcs-server ignores ifGenerationMatch on a delete (the driver never deletes)")
	} else {
		t.Errorf("delete with a wrong ifGenerationMatch = %v: the fake now enforces it; revisit the package doc", err)
	}
	// Generations after a delete and a re-create: the fake draws them from
	// its wall clock in microseconds. The driver's fences do not depend on
	// them (TestDriver_FenceDoesNotFollowGeneration).
	again, err := put(storage.Conditions{DoesNotExist: true}, "5")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("generations: %d, %d, then after delete and re-create %d", first.Generation, second.Generation, again.Generation)
}

// TestDriver_FenceDoesNotFollowGeneration: a key's first fence is the
// generation of the write that created its record; every later grant
// (release and acquire, takeover, force release) adds exactly one to the
// record's fence, even when the record's generation goes down (as Cloud
// Storage does not promise it will not).
func TestDriver_FenceDoesNotFollowGeneration(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	a, b := open(t, fake), open(t, fake)
	g := mustGrant(t, a, req("k", ownerA, time.Minute))
	if rec := record(t, fake, "k"); uint64(rec.Generation) != g.Fence {
		t.Fatalf("first fence %d, want the creating write's generation %d", g.Fence, rec.Generation)
	}
	want := g.Fence
	if err := a.Release(t.Context(), "k", ownerA); err != nil {
		t.Fatal(err)
	}
	rec := record(t, fake, "k")
	if rec.Metadata["dlock-fence"] != strconv.FormatUint(want, 10) || rec.Metadata["dlock-owner"] != "" {
		t.Fatalf("released record metadata %v, want the fence %d kept and no owner", rec.Metadata, want)
	}

	// Put the record back at a much smaller generation, as a store that
	// reuses or resets generations would.
	fake.Fake().CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{
		BucketName: bucket, Name: "locks/k", Generation: 7, Metadata: rec.Metadata,
	}})
	if got := record(t, fake, "k").Generation; got != 7 {
		t.Fatalf("record generation %d after the reset, want 7", got)
	}
	for i, d := range []*gcsdriver.Driver{b, a, b} {
		owner := []string{ownerB, ownerA, ownerC}[i]
		g := mustGrant(t, d, req("k", owner, time.Minute))
		want++
		if g.Fence != want {
			t.Fatalf("grant %d: fence %d, want %d (the record's fence + 1)", i, g.Fence, want)
		}
		if err := d.Release(t.Context(), "k", owner); err != nil {
			t.Fatal(err)
		}
	}
	// A force release keeps the fence too.
	mustGrant(t, a, req("k", ownerA, time.Minute))
	want++
	if info, err := b.ForceRelease(t.Context(), "k", "test"); err != nil || info.Fence != want {
		t.Fatalf("ForceRelease = %+v, %v; want fence %d", info, err, want)
	}
	if g := mustGrant(t, b, req("k", ownerB, time.Minute)); g.Fence != want+1 {
		t.Fatalf("fence after a force release %d, want %d", g.Fence, want+1)
	}
}

// TestDriver_TakeoverNeedsAWholeLeaseUnchanged: a record nobody renews is
// taken over only once the same waiter has seen it unchanged for the
// holder's TTL on its own clock, however old the record is; a holder that
// renews is never taken over; the takeover's fence is greater and the old
// holder's renewal and release are refused.
func TestDriver_TakeoverNeedsAWholeLeaseUnchanged(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	a, b := open(t, fake), open(t, fake)
	const ttl = 400 * time.Millisecond
	ga := mustGrant(t, a, req("dead", ownerA, ttl))
	mustGrant(t, a, req("alive", ownerA, ttl))
	time.Sleep(2 * ttl) // the record is older than its TTL: no matter

	first := time.Now()
	for _, k := range []string{"dead", "alive"} {
		if _, err := b.TryAcquire(t.Context(), req(k, ownerB, ttl)); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("first look at %q = %v, want ErrNotAcquired", k, err)
		}
	}
	var gb driver.Grant
	for {
		// The live holder renews every TTL/4.
		if err := a.Renew(t.Context(), "alive", ownerA, ttl); err != nil {
			t.Fatalf("renewal of the live holder: %v", err)
		}
		if _, err := b.TryAcquire(t.Context(), req("alive", ownerB, ttl)); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("TryAcquire of a renewed key = %v, want ErrNotAcquired", err)
		}
		g, err := b.TryAcquire(t.Context(), req("dead", ownerB, ttl))
		if err == nil {
			gb = g
			break
		}
		if !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatal(err)
		}
		if time.Since(first) > 3*ttl {
			t.Fatalf("no takeover %v after the first look", time.Since(first))
		}
		time.Sleep(ttl / 4)
	}
	if took := time.Since(first); took < ttl {
		t.Fatalf("taken over %v after the first look, before a whole TTL (%v)", took, ttl)
	}
	if gb.Fence <= ga.Fence {
		t.Fatalf("takeover fence %d not greater than %d", gb.Fence, ga.Fence)
	}
	if err := a.Renew(t.Context(), "dead", ownerA, ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("old holder's Renew = %v, want ErrLeaseLost", err)
	}
	if err := a.Release(t.Context(), "dead", ownerA); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("old holder's Release = %v, want ErrLeaseLost", err)
	}
	if info, err := a.Inspect(t.Context(), "dead"); err != nil || info.Fence != gb.Fence {
		t.Fatalf("Inspect after the takeover = %+v, %v; want B's grant", info, err)
	}
	// A driver that never looked cannot take a key at once, however old.
	c := open(t, fake)
	if _, err := c.TryAcquire(t.Context(), req("dead", ownerC, ttl)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("a fresh driver's first look = %v, want ErrNotAcquired", err)
	}
}

// TestDriver_RenewalReplyLost: a renewal applied by the store whose reply
// is lost is not a loss. The driver's next renewal finds the generation
// moved, re-reads, sees the record still names its owner, and renews; the
// lease (through the root package, heartbeats and all) stays held with its
// fence, and no one else gets the key.
func TestDriver_RenewalReplyLost(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	d, other := open(t, fake), open(t, fake)
	isWriteOf := func(name string) func(*http.Request) bool {
		return func(r *http.Request) bool {
			return r.Method == http.MethodPost && strings.Contains(r.URL.Path, "/upload/") && r.URL.Query().Get("name") == name
		}
	}

	// The driver alone.
	g := mustGrant(t, d, req("k", ownerA, time.Minute))
	before := record(t, fake, "k").Generation
	fake.DropReplies(1, isWriteOf("locks/k"))
	err := d.Renew(t.Context(), "k", ownerA, time.Minute)
	if err == nil || errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew whose reply was lost = %v, want a store error", err)
	}
	if fake.Dropped() != 0 {
		t.Fatal("the renewal never reached the store")
	}
	if after := record(t, fake, "k").Generation; after == before {
		t.Fatal("the renewal whose reply was lost was not applied")
	}
	if err := d.Renew(t.Context(), "k", ownerA, time.Minute); err != nil {
		t.Fatalf("Renew after a lost reply = %v, want nil (the record still names the owner)", err)
	}
	if info, err := other.Inspect(t.Context(), "k"); err != nil || info.Fence != g.Fence || info.Holder != "test owner-a" {
		t.Fatalf("Inspect = %+v, %v; want the owner's grant, fence %d", info, err, g.Fence)
	}

	// Through the root package: one renewal reply lost on the way.
	l := dlock.New(d, dlock.WithTTL(1500*time.Millisecond)) // renewals every 500 ms
	defer l.Close()
	ls, err := l.Acquire(t.Context(), "root")
	if err != nil {
		t.Fatal(err)
	}
	fake.DropReplies(1, isWriteOf("locks/root"))
	time.Sleep(2500 * time.Millisecond) // about five renewals
	if fake.Dropped() != 0 {
		t.Fatal("no renewal reply was dropped")
	}
	if ls.Err() != nil {
		t.Fatalf("lease lost after one renewal reply was lost: %v", ls.Err())
	}
	if _, err := other.TryAcquire(t.Context(), req("root", ownerB, time.Minute)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("another client's TryAcquire = %v, want ErrNotAcquired", err)
	}
	if err := ls.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestDriver_PausedHolderTakenOverWithGreaterFence: a holder paused (its
// renewals stopped, as by a long GC pause or SIGSTOP) loses its lease by
// its own deadline; a waiter gets the key only after that deadline, with a
// greater fence; when the holder resumes, its renewal and release are
// refused and a resource guarded by fences rejects its stale write.
func TestDriver_PausedHolderTakenOverWithGreaterFence(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	const ttl = 600 * time.Millisecond
	la, fa, err := dlocktest.OpenFaulty(t.Context(), fake.URL(bucket, "locks"), dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer la.Close()
	lb, err := dlock.Open(t.Context(), fake.URL(bucket, "locks"), dlock.WithTTL(ttl), dlock.WithBackoff(5*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()

	a, err := la.Acquire(t.Context(), "job")
	if err != nil {
		t.Fatal(err)
	}
	var resource fencedRegister
	if err := resource.write(a.Fence(), "a1"); err != nil {
		t.Fatal(err)
	}
	fa.BlockRenewals(true) // paused
	b, err := lb.Acquire(t.Context(), "job")
	grantedB := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(context.WithoutCancel(t.Context()))
	select {
	case <-a.Done():
	case <-time.After(time.Second):
		t.Fatal("the paused holder's lease is not lost after B's grant")
	}
	if !a.Deadline().Before(grantedB) {
		t.Fatalf("B granted %v before A's deadline", a.Deadline().Sub(grantedB))
	}
	if b.Fence() <= a.Fence() {
		t.Fatalf("B's fence %d not greater than A's %d", b.Fence(), a.Fence())
	}
	if err := resource.write(b.Fence(), "b1"); err != nil {
		t.Fatal(err)
	}
	// A resumes.
	fa.BlockRenewals(false)
	if err := fa.Inner().Renew(t.Context(), "job", a.Owner(), ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("the resumed holder's renewal = %v, want ErrLeaseLost", err)
	}
	if err := fa.Inner().Release(t.Context(), "job", a.Owner()); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("the resumed holder's release = %v, want ErrLeaseLost", err)
	}
	if err := resource.write(a.Fence(), "a2"); !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("the resumed holder's write = %v, want ErrStaleFence", err)
	}
	if b.Err() != nil || resource.value != "b1" {
		t.Fatalf("B's lease %v, resource %q", b.Err(), resource.value)
	}
}

// fencedRegister is a resource that keeps the greatest fence it has seen
// and refuses writes with a smaller one.
type fencedRegister struct {
	fence uint64
	value string
}

func (r *fencedRegister) write(fence uint64, v string) error {
	if fence < r.fence {
		return fmt.Errorf("write %q with fence %d after %d: %w", v, fence, r.fence, dlock.ErrStaleFence)
	}
	r.fence, r.value = fence, v
	return nil
}

// TestDriver_BlackholedStoreFailsClosed: with the link to the store
// blackholed (connections open, nothing delivered), an acquisition reports
// ErrUnavailable within the op timeout and takes no lease, and a held
// lease is lost by its deadline; after the link heals the key is taken
// over by another client, and acquisitions work again.
func TestDriver_BlackholedStoreFailsClosed(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	p := netproxy.Start(t, fake.Addr(), 1)
	const ttl = 600 * time.Millisecond
	l, err := dlock.Open(t.Context(), "gs://"+bucket+"/locks?endpoint=http://"+p.Addr(),
		dlock.WithTTL(ttl), dlock.WithOpTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held, err := l.Acquire(t.Context(), "held")
	if err != nil {
		t.Fatal(err)
	}
	// Watched from before the fault: the deadline passes while the
	// TryAcquire below waits out its op timeout.
	lost := make(chan time.Time, 1)
	go func() { <-held.Done(); lost <- time.Now() }()
	p.Hold()
	defer p.Release()
	began := time.Now()
	ls, err := l.TryAcquire(t.Context(), "other")
	if !errors.Is(err, dlock.ErrUnavailable) || ls != nil {
		t.Fatalf("TryAcquire with the link blackholed = %v, %v; want ErrUnavailable and no lease", ls, err)
	}
	if took := time.Since(began); took > 3*time.Second {
		t.Fatalf("TryAcquire took %v with the link blackholed, want about the 1s op timeout", took)
	}
	select {
	case lostAt := <-lost:
		if late := lostAt.Sub(held.Deadline()); late > time.Second {
			t.Fatalf("held lease lost %v after its deadline", late)
		}
	case <-time.After(3 * ttl):
		t.Fatal("held lease not lost with the link blackholed")
	}
	if !errors.Is(held.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("held lease ended with %v, want ErrLeaseLost", held.Err())
	}
	p.Release()
	other, err := dlock.Open(t.Context(), fake.URL(bucket, "locks"), dlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	taken, err := other.Acquire(ctx, "held")
	if err != nil {
		t.Fatalf("another client after the lost lease: %v", err)
	}
	if taken.Fence() <= held.Fence() {
		t.Fatalf("fence %d after the takeover, not greater than %d", taken.Fence(), held.Fence())
	}
	_ = taken.Release(t.Context())
	again, err := l.Acquire(ctx, "again")
	if err != nil {
		t.Fatalf("acquisition after the link healed: %v", err)
	}
	_ = again.Release(t.Context())
}

// TestDriver_InspectAndList: Inspect shows the holder, fence, TTL and a
// time left of at most the TTL; List the held keys with a prefix, sorted,
// escaped names included; free keys and other programs' objects are not
// listed.
func TestDriver_InspectAndList(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	a, b := open(t, fake), open(t, fake)
	if _, err := b.Inspect(t.Context(), "k"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect of a key never held = %v, want ErrNotAcquired", err)
	}
	g := mustGrant(t, a, req("k", ownerA, 5*time.Second))
	info, err := b.Inspect(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != "k" || info.Fence != g.Fence || info.Holder != "test owner-a" || info.TTL != 5*time.Second ||
		info.Remaining <= 0 || info.Remaining > 5*time.Second || info.Waiters != -1 {
		t.Fatalf("Inspect = %+v", info)
	}
	time.Sleep(100 * time.Millisecond)
	if again, _ := b.Inspect(t.Context(), "k"); again.Remaining > info.Remaining-50*time.Millisecond {
		t.Fatalf("time left did not go down between two looks: %v then %v", info.Remaining, again.Remaining)
	}
	if err := a.Release(t.Context(), "k", ownerA); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Inspect(t.Context(), "k"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect of a released key = %v, want ErrNotAcquired", err)
	}

	long := "a" + strings.Repeat("%", 400) // escaped past 1024 bytes: a hashed name
	keys := []string{"a/b", "a b", "a%b", "a_b", "aé", "a🔒", "b", "a/free", ".a", long}
	for _, k := range keys {
		mustGrant(t, a, req(k, ownerA, time.Minute))
	}
	if err := a.Release(t.Context(), "a/free", ownerA); err != nil {
		t.Fatal(err)
	}
	fake.Fake().CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: bucket, Name: "locks/a-not-a-record"}, Content: []byte("x")})
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"a", []string{"a b", long, "a%b", "a/b", "a_b", "aé", "a🔒"}},
		{"a%", []string{long, "a%b"}},
		{"a%%", []string{long}},
		{"a/", []string{"a/b"}},
		{".", []string{".a"}},
		{"zzz", nil},
		{"", []string{".a", "a b", long, "a%b", "a/b", "a_b", "aé", "a🔒", "b"}},
	} {
		infos, err := b.List(t.Context(), tc.prefix)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, in := range infos {
			got = append(got, in.Key)
			if in.Fence == 0 || in.TTL != time.Minute || in.Waiters != -1 || in.Holder != "test owner-a" {
				t.Errorf("List entry %+v", in)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
	if info, err := b.Inspect(t.Context(), long); err != nil || info.Key != long {
		t.Fatalf("Inspect of the hashed-name key = %+v, %v", info, err)
	}
}

// TestDriver_ForceRelease: an operator's force release frees a held key
// whoever holds it and reports what it removed; the holder's renewal is
// then refused; a free key is ErrNotAcquired.
func TestDriver_ForceRelease(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	a, b := open(t, fake), open(t, fake)
	if _, err := b.ForceRelease(t.Context(), "k", "test"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("ForceRelease of a free key = %v, want ErrNotAcquired", err)
	}
	g := mustGrant(t, a, req("k", ownerA, time.Minute))
	info, err := b.ForceRelease(t.Context(), "k", "holder is dead")
	if err != nil || info.Fence != g.Fence || info.Holder != "test owner-a" {
		t.Fatalf("ForceRelease = %+v, %v", info, err)
	}
	if err := a.Renew(t.Context(), "k", ownerA, time.Minute); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after a force release = %v, want ErrLeaseLost", err)
	}
	if g2 := mustGrant(t, b, req("k", ownerB, time.Minute)); g2.Fence <= g.Fence {
		t.Fatalf("fence %d after a force release, not greater than %d", g2.Fence, g.Fence)
	}
}

// TestDriver_ForeignObjectIsNotTouched: an object of another program at a
// record's name is refused as invalid (never overwritten, never an
// outage).
func TestDriver_ForeignObjectIsNotTouched(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	d := open(t, fake)
	fake.Fake().CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: bucket, Name: "locks/report.csv"}, Content: []byte("data")})
	_, err := d.TryAcquire(t.Context(), req("report.csv", ownerA, time.Minute))
	if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("TryAcquire over a foreign object = %v, want ErrInvalidArgument", err)
	}
	o, err := fake.Fake().GetObject(bucket, "locks/report.csv")
	if err != nil || string(o.Content) != "data" {
		t.Fatalf("the foreign object changed: %q, %v", o.Content, err)
	}
}

// TestOpen_InvalidURLIsInvalidArgument: URLs the driver or the store
// refuses (a bad bucket name, a port, credentials in the URL, unknown or
// bad parameters, a bucket that does not exist) match ErrInvalidArgument,
// never ErrUnavailable; a store that does not answer is ErrUnavailable.
func TestOpen_InvalidURLIsInvalidArgument(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	ep := "?endpoint=" + fake.Endpoint()
	urls := []string{
		"gs:///locks" + ep,
		"gs://UPPER/locks" + ep,
		"gs://ab/locks" + ep,
		"gs://" + bucket + ":443/locks" + ep,
		"gs://user:secret@" + bucket + "/locks" + ep,
		"gs://" + bucket + "/locks" + ep + "&nope=1",
		"gs://" + bucket + "/locks" + ep + "&auth=maybe",
		"gs://" + bucket + "/locks?endpoint=ftp://127.0.0.1:1",
		"gs://" + bucket + "/locks?endpoint=127.0.0.1:99999",
		"gs://" + bucket + "/locks?endpoint=127.0.0.1:",
		"gs://" + bucket + "/locks?endpoint=a:1,b:2",
		"gs://" + bucket + "/a/../b" + ep,
		"gs://" + bucket + "/a%0Ab" + ep,
		"gs://" + bucket + "/" + strings.Repeat("p", 300) + ep,
		"gs://no-such-bucket/locks" + ep,
		"gs://" + bucket + "/locks" + ep + "#frag",
		"gcs://" + bucket + "/locks" + ep,
	}
	errs := dlocktest.OpenRefuses(t, gcsdriver.Open, urls...)
	dlocktest.RootOpenNotUnavailable(t, urls...)
	for i, err := range errs {
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q) error shows the password: %v", urls[i], err)
		}
	}
	if err := errs[len(errs)-3]; err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Open of a missing bucket = %v, want it to say the bucket does not exist", err)
	}

	fake.Stop()
	if _, err := dlock.Open(t.Context(), fake.URL(bucket, "locks")); !errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Open with the store down = %v, want ErrUnavailable", err)
	}
}

// TestCLI_StatusAndList: dlock status and dlock list work on gs:// URLs.
func TestCLI_StatusAndList(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	d := open(t, fake)
	g := mustGrant(t, d, driver.AcquireRequest{Key: "payout:2026-09", Owner: ownerA, TTL: 30 * time.Second, Holder: "worker 7"})
	mustGrant(t, d, req("payout:2026-10", ownerA, 30*time.Second))
	store := fake.URL(bucket, "locks")
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		t.Setenv("DLOCK_CONFIG", "")
		t.Setenv("XDG_CONFIG_HOME", t.TempDir())
		code := cli.Main(t.Context(), append([]string{"--store", store}, args...), strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, errOut := run("status", "payout:2026-09")
	if code != 0 || !strings.Contains(out, "held by:  worker 7") || !strings.Contains(out, fmt.Sprintf("fence:    %d", g.Fence)) ||
		!strings.Contains(out, "ttl:      30s") || !strings.Contains(out, "left:") {
		t.Fatalf("dlock status = %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = run("status", "payout:free")
	if code != 0 || !strings.Contains(out, "payout:free: free") {
		t.Fatalf("dlock status of a free key = %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = run("list", "payout:")
	if code != 0 || !strings.Contains(out, "payout:2026-09") || !strings.Contains(out, "payout:2026-10") || !strings.Contains(out, "worker 7") {
		t.Fatalf("dlock list = %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = run("release", "--force", "--reason", "test", "payout:2026-10")
	if code != 0 {
		t.Fatalf("dlock release --force = %d\n%s\n%s", code, out, errOut)
	}
	if _, err := d.Inspect(t.Context(), "payout:2026-10"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("after dlock release --force: Inspect = %v, want ErrNotAcquired", err)
	}
}
