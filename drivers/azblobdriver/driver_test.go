package azblobdriver_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	_ "modernc.org/sqlite"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/azblobdriver"
	"github.com/dlock-dev/dlock/fence/fencesql"
	"github.com/dlock-dev/dlock/internal/cli"
	"github.com/dlock-dev/dlock/internal/netproxy"
	"github.com/dlock-dev/dlock/internal/testservers"
)

var ownerSeq atomic.Int64

// owner returns a fresh owner token (32 hex digits, as the root sends).
func owner() string {
	return fmt.Sprintf("%016x%016x", time.Now().UnixNano(), ownerSeq.Add(1))
}

func req(key string, ttl time.Duration) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Owner: owner(), TTL: ttl, Holder: "test host:1 pid 42"}
}

func open(t *testing.T, rawURL string) *azblobdriver.Driver {
	t.Helper()
	d, err := azblobdriver.Open(t.Context(), rawURL)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func grant(t *testing.T, d driver.Driver, r driver.AcquireRequest) driver.Grant {
	t.Helper()
	g, err := d.TryAcquire(t.Context(), r)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", r.Key, err)
	}
	if g.Fence == 0 {
		t.Fatalf("TryAcquire(%q): fence 0", r.Key)
	}
	return g
}

// TestServiceLease_MapsTTLsSafely: a TTL is served by a service lease no
// shorter than it (rounded up to whole seconds, at least 15 s); a TTL that
// no service lease can cover is refused with ErrInvalidTTL, before any
// request, by the driver and through the root package alike.
func TestServiceLease_MapsTTLsSafely(t *testing.T) {
	for _, tc := range []struct {
		ttl  time.Duration
		want time.Duration
	}{
		{100 * time.Millisecond, 15 * time.Second},
		{time.Second, 15 * time.Second},
		{15 * time.Second, 15 * time.Second},
		{15*time.Second + time.Millisecond, 16 * time.Second},
		{30 * time.Second, 30 * time.Second},
		{59*time.Second + 500*time.Millisecond, 60 * time.Second},
		{60 * time.Second, 60 * time.Second},
	} {
		got, err := azblobdriver.ServiceLease(tc.ttl)
		if err != nil || got != tc.want {
			t.Errorf("ServiceLease(%v) = %v, %v; want %v", tc.ttl, got, err, tc.want)
		}
		if got < tc.ttl {
			t.Errorf("ServiceLease(%v) = %v is shorter than the TTL: the client would outlive the service's lease", tc.ttl, got)
		}
	}
	for _, ttl := range []time.Duration{0, 99 * time.Millisecond, 60*time.Second + time.Millisecond, time.Hour, 24 * time.Hour} {
		if _, err := azblobdriver.ServiceLease(ttl); !errors.Is(err, driver.ErrInvalidTTL) {
			t.Errorf("ServiceLease(%v) = %v, want ErrInvalidTTL", ttl, err)
		}
	}

	// No request is sent: the endpoint is a closed port.
	c, err := container.NewClientWithNoCredential("http://127.0.0.1:1/devstoreaccount1/none", nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := azblobdriver.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	r := req("k", time.Minute+time.Second)
	if _, err := d.TryAcquire(t.Context(), r); !errors.Is(err, driver.ErrInvalidTTL) {
		t.Errorf("TryAcquire with a 61 s TTL = %v, want ErrInvalidTTL", err)
	}
	if err := d.Renew(t.Context(), "k", r.Owner, 2*time.Minute); !errors.Is(err, driver.ErrInvalidTTL) {
		t.Errorf("Renew with a 2 min TTL = %v, want ErrInvalidTTL", err)
	}
	l := dlock.New(d)
	defer l.Close()
	_, err = l.TryAcquire(t.Context(), "k", dlock.WithTTL(5*time.Minute))
	if !errors.Is(err, dlock.ErrInvalidTTL) || errors.Is(err, dlock.ErrUnavailable) {
		t.Errorf("Locker.TryAcquire with a 5 min TTL = %v, want ErrInvalidTTL (not ErrUnavailable)", err)
	}
}

// TestLeaseID_IsAUUIDDerivedFromTheOwner: the lease ID is a UUID, the same
// for the same owner token, different for different ones, and never the
// token itself.
func TestLeaseID_IsAUUIDDerivedFromTheOwner(t *testing.T) {
	a, b := owner(), owner()
	la, lb := azblobdriver.LeaseID(a), azblobdriver.LeaseID(b)
	if la != azblobdriver.LeaseID(a) || la == lb {
		t.Fatalf("LeaseID(%q) = %s, LeaseID(%q) = %s", a, la, b, lb)
	}
	if len(la) != 36 || la[8] != '-' || la[13] != '-' || la[14] != '8' || la[18] != '-' || la[23] != '-' || strings.Contains(la, a[:8]) {
		t.Fatalf("LeaseID = %q, want a version-8 UUID not containing the token", la)
	}
}

// TestOpen_RefusesBadURLs: every malformed URL or missing credential is
// ErrInvalidArgument, never ErrUnavailable, and no message shows a key.
func TestOpen_RefusesBadURLs(t *testing.T) {
	const secret = "c2VjcmV0LWtleS1tdXN0LW5vdC1sZWFr!!" // not base64
	t.Setenv(azblobdriver.KeyEnv, secret)
	ep := "&endpoint=http%3A%2F%2F127.0.0.1%3A10000%2Fdevstoreaccount1"
	errs := dlocktest.OpenRefuses(t, azblobdriver.Open,
		"azblob://devstoreaccount1/locks?auth=emulator&endpoint=ftp%3A%2F%2Fhost",
		"azblob://devstoreaccount1/locks?auth=emulator&endpoint=http%3A%2F%2F127.0.0.1%3A0%2Fx",
		"azblob://devstoreaccount1/locks?auth=emulator&endpoint=http%3A%2F%2F127.0.0.1%3A10000%2Fx%3Fsig%3Dabc",
		"azblob://devstoreaccount1/locks?auth=emulator&nope=1"+ep,
		"azblob://devstoreaccount1/locks?auth=bogus"+ep,
		"azblob://devstoreaccount1/locks?auth=emulator&auth=sharedkey"+ep,
		"azblob://devstoreaccount1/locks?auth=emulator&create_container=maybe"+ep,
		"azblob://devstoreaccount1/locks?auth=default"+ep, // a bearer token over http
		"azblob://otheraccount/locks?auth=emulator"+ep,
		"azblob://devstoreaccount1/locks?auth=sharedkey"+ep, // AZURE_STORAGE_KEY is not base64
		"azblob://Dev/locks?auth=emulator"+ep,
		"azblob://devstoreaccount1/?auth=emulator"+ep,
		"azblob://devstoreaccount1/Locks?auth=emulator"+ep,
		"azblob://devstoreaccount1/lo--cks?auth=emulator"+ep,
		"azblob://devstoreaccount1/locks/sub?auth=emulator"+ep,
		"azblob://user:pw@devstoreaccount1/locks?auth=emulator"+ep,
		"azblob:///locks?auth=emulator"+ep,
		"redis://devstoreaccount1/locks",
	)
	for _, err := range errs {
		if err != nil && (strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), azblobdriver.EmulatorKey) || strings.Contains(err.Error(), "pw@")) {
			t.Errorf("error shows a secret: %v", err)
		}
	}
	t.Setenv(azblobdriver.KeyEnv, "")
	errs = dlocktest.OpenRefuses(t, azblobdriver.Open, "azblob://devstoreaccount1/locks?auth=sharedkey"+ep)
	if errs[0] == nil || !strings.Contains(errs[0].Error(), azblobdriver.KeyEnv) {
		t.Errorf("auth=sharedkey without %s = %v, want an error naming the variable", azblobdriver.KeyEnv, errs[0])
	}
	dlocktest.RootOpenNotUnavailable(t, "azblob://devstoreaccount1/Locks?auth=emulator"+ep, "azblob://x/locks")
}

// TestOpen_UnreachableIsUnavailable: a service that does not answer is
// ErrUnavailable, within Open's context.
func TestOpen_UnreachableIsUnavailable(t *testing.T) {
	port := testservers.FreePort(t) // nothing listens there
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := azblobdriver.Open(ctx, testservers.AzuriteURL(fmt.Sprintf("127.0.0.1:%d", port), "locks"))
	if !errors.Is(err, driver.ErrUnavailable) || errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("Open on a closed port = %v, want ErrUnavailable", err)
	}
}

// driverTests are the driver's own checks, run by TestConformance against
// its Azurite: what the conformance suite cannot see from outside.
var driverTests = []struct {
	name string
	fn   func(t *testing.T, az *testservers.Azurite)
}{
	{"InspectListAndForceRelease", testInspectListForce},
	{"ContainerCreatedOnlyWhenAllowed", testContainerCreation},
	{"WrongKeyIsPermissionDenied", testWrongKey},
	{"RenewalReplyLostIsNotALoss", testRenewalReplyLost},
	{"StoreUnreachableFailsClosed", testUnreachable},
	{"CLIStatusListAndForceRelease", testCLI},
}

func testInspectListForce(t *testing.T, az *testservers.Azurite) {
	a := open(t, az.URL("inspect"))
	b := open(t, az.URL("inspect"))
	ctx := t.Context()
	// A blob that is not a lock blob is ignored.
	if _, err := containerClient(t, az, "inspect", nil).NewBlockBlobClient("README.txt").Upload(ctx, streaming.NopCloser(strings.NewReader("not a lock")), nil); err != nil {
		t.Fatal(err)
	}
	keys := []string{"job:a/b c", "job:émoji 🔒", "job:z", "other:1"}
	grants := map[string]driver.Grant{}
	reqs := map[string]driver.AcquireRequest{}
	for _, k := range keys {
		r := req(k, 2*time.Second)
		r.Holder = "host-" + k + " \"quoted\" ü"
		reqs[k], grants[k] = r, grant(t, a, r)
	}
	info, err := b.Inspect(ctx, "job:a/b c")
	if err != nil {
		t.Fatal(err)
	}
	want := driver.HolderInfo{Key: "job:a/b c", Fence: grants["job:a/b c"].Fence, Holder: reqs["job:a/b c"].Holder, TTL: 2 * time.Second, Waiters: -1}
	if info != want {
		t.Fatalf("Inspect = %+v, want %+v", info, want)
	}
	list, err := b.List(ctx, "job:")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, hi := range list {
		got = append(got, hi.Key)
		if hi.Fence != grants[hi.Key].Fence || hi.Holder != reqs[hi.Key].Holder {
			t.Errorf("List entry %+v, want fence %d holder %q", hi, grants[hi.Key].Fence, reqs[hi.Key].Holder)
		}
	}
	if strings.Join(got, "|") != "job:a/b c|job:z|job:émoji 🔒" {
		t.Fatalf("List(job:) keys = %q, want sorted by bytes", got)
	}
	if all, err := b.List(ctx, ""); err != nil || len(all) != 4 {
		t.Fatalf("List(\"\") = %d entries, %v; want 4", len(all), err)
	}
	// A released key is free, and no longer listed.
	if err := a.Release(ctx, "job:z", reqs["job:z"].Owner); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Inspect(ctx, "job:z"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect of a released key = %v, want ErrNotAcquired", err)
	}
	if _, err := b.Inspect(ctx, "never used"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect of an unknown key = %v, want ErrNotAcquired", err)
	}
	if list, _ := b.List(ctx, "job:"); len(list) != 2 {
		t.Fatalf("List after a release = %+v, want 2 entries", list)
	}

	// Force release breaks the lease: the holder's renewal and release are
	// refused, the next grant has a greater fence.
	k := "job:a/b c"
	fi, err := b.ForceRelease(ctx, k, "operator: holder known dead")
	if err != nil || fi.Fence != grants[k].Fence || fi.Holder != reqs[k].Holder {
		t.Fatalf("ForceRelease = %+v, %v; want the grant it removed", fi, err)
	}
	if _, err := b.ForceRelease(ctx, k, "again"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("second ForceRelease = %v, want ErrNotAcquired", err)
	}
	if err := a.Renew(ctx, k, reqs[k].Owner, 2*time.Second); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after a force release = %v, want ErrLeaseLost", err)
	}
	if err := a.Release(ctx, k, reqs[k].Owner); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Release after a force release = %v, want ErrLeaseLost", err)
	}
	r := req(k, 2*time.Second)
	r.Holder = "" // no holder: none is stored, and none is shown
	g := grant(t, b, r)
	if g.Fence <= grants[k].Fence {
		t.Fatalf("fence after a force release %d, not greater than %d", g.Fence, grants[k].Fence)
	}
	if info, err := a.Inspect(ctx, k); err != nil || info.Holder != "" || info.Fence != g.Fence {
		t.Fatalf("Inspect of a grant without holder = %+v, %v", info, err)
	}
}

// containerClient returns a client of container on az with the emulator's
// key, whose HTTP transport is tr (nil: a new one, closed when t ends).
func containerClient(t *testing.T, az *testservers.Azurite, name string, tr policy.Transporter) *container.Client {
	t.Helper()
	if tr == nil {
		hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		t.Cleanup(hc.CloseIdleConnections)
		tr = hc
	}
	cred, err := container.NewSharedKeyCredential(azblobdriver.EmulatorAccount, azblobdriver.EmulatorKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := container.NewClientWithSharedKeyCredential(az.Endpoint()+"/"+name, cred, &container.ClientOptions{
		ClientOptions: azcore.ClientOptions{Transport: tr, Retry: policy.RetryOptions{MaxRetries: -1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testContainerCreation(t *testing.T, az *testservers.Azurite) {
	_, err := azblobdriver.Open(t.Context(), az.URL("not-created")+"&create_container=false")
	if !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "create_container") {
		t.Fatalf("Open on a missing container with create_container=false = %v, want ErrInvalidArgument naming create_container", err)
	}
	d := open(t, az.URL("created-by-open"))
	grant(t, d, req("k", time.Second))
	// A driver made by New creates the container on its first grant.
	d2, err := azblobdriver.New(containerClient(t, az, "created-by-grant", nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	grant(t, d2, req("k", time.Second))
	d3, err := azblobdriver.New(containerClient(t, az, "never-created", nil), &azblobdriver.Options{NoCreateContainer: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d3.Close()
	if _, err := d3.TryAcquire(t.Context(), req("k", time.Second)); !errors.Is(err, driver.ErrInvalidArgument) {
		t.Fatalf("TryAcquire with NoCreateContainer on a missing container = %v, want ErrInvalidArgument", err)
	}
}

func testWrongKey(t *testing.T, az *testservers.Azurite) {
	cred, err := container.NewSharedKeyCredential(azblobdriver.EmulatorAccount, "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk=")
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer hc.CloseIdleConnections()
	c, err := container.NewClientWithSharedKeyCredential(az.Endpoint()+"/locks", cred, &container.ClientOptions{
		ClientOptions: azcore.ClientOptions{Transport: hc, Retry: policy.RetryOptions{MaxRetries: -1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	d, err := azblobdriver.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_, err = d.TryAcquire(t.Context(), req("k", time.Second))
	if !errors.Is(err, driver.ErrPermissionDenied) || errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("TryAcquire with a wrong account key = %v, want ErrPermissionDenied", err)
	}
	l := dlock.New(d)
	defer l.Close()
	if _, err := l.TryAcquire(t.Context(), "k"); !errors.Is(err, dlock.ErrPermissionDenied) || errors.Is(err, dlock.ErrUnavailable) {
		t.Fatalf("Locker.TryAcquire with a wrong account key = %v, want ErrPermissionDenied", err)
	}
}

// dropper is an HTTP transport that can lose the reply of a renewal: the
// request reaches the service and is carried out, the reply is discarded
// and the caller gets a connection error, as when a link fails after the
// request went out.
type dropper struct {
	hc      *http.Client
	mu      sync.Mutex
	armed   int
	dropped chan struct{}
}

func newDropper(t *testing.T) *dropper {
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	t.Cleanup(hc.CloseIdleConnections)
	return &dropper{hc: hc, dropped: make(chan struct{}, 16)}
}

func (x *dropper) dropNextRenewal() {
	x.mu.Lock()
	x.armed++
	x.mu.Unlock()
}

func (x *dropper) Do(r *http.Request) (*http.Response, error) {
	resp, err := x.hc.Do(r)
	if err != nil || leaseAction(r) != "renew" {
		return resp, err
	}
	x.mu.Lock()
	drop := x.armed > 0
	if drop {
		x.armed--
	}
	x.mu.Unlock()
	if !drop {
		return resp, nil
	}
	resp.Body.Close()
	x.dropped <- struct{}{}
	return nil, errors.New("test: connection reset after the renewal was sent (reply lost)")
}

// leaseAction returns the x-ms-lease-action header of r (the SDK sets it
// in lowercase, not in the canonical form Header.Get looks for).
func leaseAction(r *http.Request) string {
	for k, v := range r.Header {
		if strings.EqualFold(k, "x-ms-lease-action") && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// testRenewalReplyLost: a renewal the service carried out but whose reply
// was lost is a store error, not ErrLeaseLost, and the next renewal finds
// the lease still the holder's (the service answers by lease ID); through
// the root package's heartbeat the lease is kept.
func testRenewalReplyLost(t *testing.T, az *testservers.Azurite) {
	const ttl = 2 * time.Second
	x := newDropper(t)
	d, err := azblobdriver.New(containerClient(t, az, "replylost", x), nil)
	if err != nil {
		t.Fatal(err)
	}
	l := dlock.New(d, dlock.WithTTL(ttl), dlock.WithOpTimeout(time.Second))
	defer l.Close()
	other := open(t, az.URL("replylost"))
	ctx := t.Context()
	const k = "reply-lost"
	ls, err := l.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}

	x.dropNextRenewal()
	select {
	case <-x.dropped: // the heartbeat's renewal went out, its reply was lost
	case <-time.After(5 * ttl):
		t.Fatal("the heartbeat sent no renewal")
	}
	droppedAt := time.Now()
	drift := ttl/100 + 2*time.Millisecond
	for !ls.Deadline().After(droppedAt.Add(ttl - drift)) {
		select {
		case <-ls.Done():
			t.Fatalf("lease lost after a renewal reply was lost: %v", ls.Err())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Since(droppedAt) > 2*ttl {
			t.Fatalf("no renewal confirmed %v after the lost reply", time.Since(droppedAt))
		}
	}
	t.Logf("a later renewal was confirmed %v after the lost reply", time.Since(droppedAt))

	// The same at the driver: an ambiguous answer, then the service's.
	x.dropNextRenewal()
	err = d.Renew(ctx, k, ls.Owner(), ttl)
	if err == nil || errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew whose reply was lost = %v, want a store error (not ErrLeaseLost)", err)
	}
	if err := d.Renew(ctx, k, ls.Owner(), ttl); err != nil {
		t.Fatalf("Renew after a lost reply = %v, want nil: the lease still names the holder", err)
	}
	if _, err := other.TryAcquire(ctx, req(k, ttl)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("another client after the lost replies = %v, want ErrNotAcquired", err)
	}
	if info, err := other.Inspect(ctx, k); err != nil || info.Fence != ls.Fence() {
		t.Fatalf("Inspect = %+v, %v; want fence %d", info, err, ls.Fence())
	}
	if ls.Err() != nil {
		t.Fatalf("lease ended: %v", ls.Err())
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// testUnreachable: with the link to the service blackholed (a proxy holds
// every byte), acquisitions fail closed with ErrUnavailable within the op
// timeout and no lease, a held lease is lost by its own deadline, and the
// service still holds that key for its service lease (no other client gets
// it meanwhile).
func testUnreachable(t *testing.T, az *testservers.Azurite) {
	const ttl, op = time.Second, 500 * time.Millisecond
	p := netproxy.Start(t, az.Addr(), uint64(time.Now().UnixNano()))
	d := open(t, testservers.AzuriteURL(p.Addr(), "unreachable"))
	l := dlock.New(d, dlock.WithTTL(ttl), dlock.WithOpTimeout(op))
	defer l.Close()
	other := open(t, az.URL("unreachable"))
	ctx := t.Context()
	ls, err := l.Acquire(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	p.Hold()
	defer p.Release()
	heldAt := time.Now()
	lostAt := make(chan time.Time, 1)
	go func() { <-ls.Done(); lostAt <- time.Now() }()

	for _, wait := range []bool{false, true} {
		began := time.Now()
		var got *dlock.Lease
		if wait {
			got, err = l.Acquire(ctx, "other", dlock.WithRetryFor(0))
		} else {
			got, err = l.TryAcquire(ctx, "other")
		}
		took := time.Since(began)
		if !errors.Is(err, dlock.ErrUnavailable) || got != nil {
			t.Fatalf("acquire (wait=%v) with the link blackholed = %v, %v; want ErrUnavailable and no lease", wait, got, err)
		}
		if took > op+time.Second {
			t.Errorf("acquire (wait=%v) took %v, more than the op timeout %v plus 1 s", wait, took, op)
		}
	}
	select {
	case at := <-lostAt:
		late := at.Sub(ls.Deadline())
		t.Logf("held lease lost %v after the link was blackholed, %v after its deadline", at.Sub(heldAt), late)
		if late > 250*time.Millisecond {
			t.Errorf("lease lost %v after its deadline", late)
		}
		if !errors.Is(ls.Err(), dlock.ErrLeaseLost) {
			t.Errorf("Err() = %v, want ErrLeaseLost", ls.Err())
		}
	case <-time.After(time.Until(ls.Deadline()) + 2*time.Second):
		t.Fatalf("lease still held %v after its deadline with the link blackholed", time.Since(ls.Deadline()))
	}
	// Fail closed on the service side too: the key is still leased there.
	if _, err := other.TryAcquire(ctx, req("held", ttl)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("another client right after the holder lost its lease = %v, want ErrNotAcquired (the service lease lasts 15 s)", err)
	}
}

// testServiceExpiry: a holder paused past its lease (its heartbeat
// stopped: no renewal reaches the service) loses it by its own deadline;
// the service ends its real 15 s lease, and only then does another client
// get the key, with a greater fence; the paused holder's late write is
// refused by the resource's fence check, and its renewal and release are
// refused by the service.
func testServiceExpiry(t *testing.T, az *testservers.Azurite) {
	const ttl = time.Second
	fa := dlocktest.NewFaultDriver(open(t, az.URL("expiry")), t.Logf)
	a := dlock.New(fa, dlock.WithTTL(ttl))
	defer a.Close()
	bd := open(t, az.URL("expiry"))
	b := dlock.New(bd, dlock.WithTTL(ttl), dlock.WithBackoff(20*time.Millisecond, 250*time.Millisecond))
	defer b.Close()
	ctx := t.Context()
	const k = "settle:42"

	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "resource.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	table := fencesql.Table{}
	if err := table.Create(ctx, fencesql.SQL(db)); err != nil {
		t.Fatal(err)
	}

	la, err := a.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if err := table.Advance(ctx, fencesql.SQL(db), k, la.Fence()); err != nil {
		t.Fatalf("holder's first write: %v", err)
	}
	dlocktest.Faults(fa).BlockRenewals(true) // paused: its heartbeat reaches nothing
	pausedAt := time.Now()
	select {
	case <-la.Done():
	case <-time.After(3 * ttl):
		t.Fatal("the paused holder's lease was not lost by its deadline")
	}
	if !errors.Is(la.Err(), dlock.ErrLeaseLost) || time.Since(la.Deadline()) > 250*time.Millisecond {
		t.Fatalf("paused holder: Err %v, lost %v after its deadline", la.Err(), time.Since(la.Deadline()))
	}
	if _, err := b.TryAcquire(ctx, k); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("another client before the service lease ended = %v, want ErrNotAcquired", err)
	}
	info, err := bd.Inspect(ctx, k)
	if err != nil || info.Fence != la.Fence() {
		t.Fatalf("Inspect before the service lease ended = %+v, %v; want the paused holder's fence %d", info, err, la.Fence())
	}

	wctx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	lb, err := b.Acquire(wctx, k)
	grantedAt := time.Now()
	if err != nil {
		t.Fatalf("the key was not taken over after the service lease: %v", err)
	}
	defer lb.Release(context.WithoutCancel(ctx))
	waited := grantedAt.Sub(pausedAt)
	t.Logf("taken over %v after the holder paused (service lease %v, TTL %v); fences %d -> %d", waited, azblobdriver.MinServiceLease, ttl, la.Fence(), lb.Fence())
	// The service saw its last renewal at most one heartbeat (TTL/3)
	// before the pause.
	if min := azblobdriver.MinServiceLease - ttl/3 - 100*time.Millisecond; waited < min {
		t.Fatalf("taken over %v after the pause, before the %v service lease could have ended", waited, azblobdriver.MinServiceLease)
	}
	if waited > azblobdriver.MinServiceLease+5*time.Second {
		t.Errorf("taken over only %v after the pause", waited)
	}
	if lb.Fence() <= la.Fence() {
		t.Fatalf("successor's fence %d is not greater than the paused holder's %d", lb.Fence(), la.Fence())
	}
	if err := table.Advance(ctx, fencesql.SQL(db), k, lb.Fence()); err != nil {
		t.Fatalf("successor's write: %v", err)
	}
	// The paused holder resumes: its late write is stale, and the service
	// refuses its renewal and release.
	if err := table.Advance(ctx, fencesql.SQL(db), k, la.Fence()); !errors.Is(err, dlock.ErrStaleFence) {
		t.Fatalf("the paused holder's late write = %v, want ErrStaleFence", err)
	}
	if err := dlocktest.Faults(fa).Inner().Renew(ctx, k, la.Owner(), ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("the paused holder's renewal = %v, want ErrLeaseLost", err)
	}
	if err := dlocktest.Faults(fa).Inner().Release(ctx, k, la.Owner()); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("the paused holder's release = %v, want ErrLeaseLost", err)
	}
	if lb.Err() != nil {
		t.Fatalf("the successor's lease ended: %v", lb.Err())
	}
}

// runCLI runs the dlock command line tool in this process against store.
func runCLI(t *testing.T, store string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Main(t.Context(), append([]string{"--store", store}, args...), strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// testCLI: dlock status, list and release --force work on an azblob://
// store.
func testCLI(t *testing.T, az *testservers.Azurite) {
	store := az.URL("cli")
	d := open(t, store)
	l := dlock.New(d, dlock.WithTTL(5*time.Second), dlock.WithHolder("worker-7"))
	defer l.Close()
	ls, err := l.Acquire(t.Context(), "settle:{m42}:2026-09-30")
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, store, "status", "-o", "json", ls.Key())
	if code != cli.ExitOK {
		t.Fatalf("dlock status: exit %d\n%s%s", code, out, errs)
	}
	var st struct {
		Key    string  `json:"key"`
		Held   bool    `json:"held"`
		Fence  uint64  `json:"fence"`
		Holder string  `json:"holder"`
		TTL    float64 `json:"ttl_seconds"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("dlock status -o json: %v\n%s", err, out)
	}
	if !st.Held || st.Key != ls.Key() || st.Fence != ls.Fence() || st.Holder != "worker-7" || st.TTL != 5 {
		t.Fatalf("dlock status = %+v, want held by worker-7 with fence %d, TTL 5 s", st, ls.Fence())
	}
	code, out, errs = runCLI(t, store, "list", "settle:")
	if code != cli.ExitOK || !strings.Contains(out, ls.Key()) || !strings.Contains(out, "worker-7") {
		t.Fatalf("dlock list: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = runCLI(t, store, "release", "--force", ls.Key(), "--reason", "test: holder is dead")
	if code != cli.ExitOK {
		t.Fatalf("dlock release --force: exit %d\n%s%s", code, out, errs)
	}
	select {
	case <-ls.Done():
		if !errors.Is(ls.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("holder after the force release: %v, want ErrLeaseLost", ls.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not lose its lease after a force release")
	}
	code, out, _ = runCLI(t, store, "status", "-o", "json", ls.Key())
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Held {
		t.Fatalf("dlock status after the force release: exit %d %s", code, out)
	}
}
