package azblobdriver_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/azblobdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestFaults checks the driver against Azurite with faults placed between
// its requests: a grant that changes hands between a force release's read
// and its break, and a lease that is being broken.
func TestFaults(t *testing.T) {
	az := testservers.StartAzurite(t)
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, *testservers.Azurite)
	}{
		{"ForceRelease_BreaksOnlyTheGrantItRead", testForceReleaseBreaksOnlyTheGrantItRead},
		{"BreakingLease_IsLostForItsHolder", testBreakingLeaseIsLost},
		{"CorruptFence_IsPermanent", testCorruptFenceIsPermanent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, az)
		})
	}
}

// interposer is an HTTP transport that runs a step between two requests
// of a call: once armed, right after the service answered the next
// matching request (a Get Blob Properties, a lease acquisition), before
// the caller sees the answer.
type interposer struct {
	hc   *http.Client
	mu   sync.Mutex
	on   func(*http.Request) bool
	step func()
}

func newInterposer(t *testing.T) *interposer {
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	t.Cleanup(hc.CloseIdleConnections)
	return &interposer{hc: hc}
}

func (x *interposer) afterNextRead(step func()) {
	x.after(func(r *http.Request) bool { return r.Method == http.MethodHead }, step)
}

func (x *interposer) afterNextLeaseAcquire(step func()) {
	x.after(func(r *http.Request) bool { return leaseAction(r) == "acquire" }, step)
}

func (x *interposer) after(on func(*http.Request) bool, step func()) {
	x.mu.Lock()
	x.on, x.step = on, step
	x.mu.Unlock()
}

func (x *interposer) Do(r *http.Request) (*http.Response, error) {
	resp, err := x.hc.Do(r)
	if err != nil {
		return resp, err
	}
	x.mu.Lock()
	var step func()
	if x.step != nil && x.on(r) {
		step, x.step = x.step, nil
	}
	x.mu.Unlock()
	if step != nil {
		step()
	}
	return resp, nil
}

// testForceReleaseBreaksOnlyTheGrantItRead: a force release removes only
// the grant it read and reports. When that grant ends and the key is
// granted again between the read and the break, the new grant is left
// alone and the call says the key changed; when the grant read is only
// renewed in between, it is the one broken.
func testForceReleaseBreaksOnlyTheGrantItRead(t *testing.T, az *testservers.Azurite) {
	const ttl = 2 * time.Second
	ctx := t.Context()
	a, b := open(t, az.URL("force-race")), open(t, az.URL("force-race"))
	x := newInterposer(t)
	admin, err := azblobdriver.New(containerClient(t, az, "force-race", x), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })

	// The grant read ends (broken by another operator) and b is granted
	// the key before the break: b's grant must survive.
	ra := req("raced", ttl)
	ga := grant(t, a, ra)
	rb := req("raced", ttl)
	var gb driver.Grant
	x.afterNextRead(func() {
		if _, err := b.ForceRelease(ctx, "raced", "another operator"); err != nil {
			t.Errorf("the other operator's force release: %v", err)
		}
		gb = grant(t, b, rb)
	})
	hi, err := admin.ForceRelease(ctx, "raced", "operator: holder known dead")
	if err == nil || errors.Is(err, driver.ErrNotAcquired) {
		t.Errorf("ForceRelease across a new grant = %+v, %v; want an error saying the key changed", hi, err)
	}
	if err := b.Renew(ctx, "raced", rb.Owner, ttl); err != nil {
		t.Fatalf("the new grant (fence %d, after %d) was broken by a force release that read the old one: Renew = %v", gb.Fence, ga.Fence, err)
	}
	if info, err := a.Inspect(ctx, "raced"); err != nil || info.Fence != gb.Fence {
		t.Fatalf("Inspect after the refused force release = %+v, %v; want the new grant, fence %d", info, err, gb.Fence)
	}
	// Run again, it reads and breaks the new grant, and reports it.
	hi, err = admin.ForceRelease(ctx, "raced", "operator: again")
	if err != nil || hi.Fence != gb.Fence {
		t.Fatalf("second ForceRelease = %+v, %v; want the new grant, fence %d", hi, err, gb.Fence)
	}
	if err := b.Renew(ctx, "raced", rb.Owner, ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after the second force release = %v, want ErrLeaseLost", err)
	}

	// The grant read is renewed in between: still the same grant, broken.
	rc := req("renewed", ttl)
	gc := grant(t, a, rc)
	x.afterNextRead(func() {
		if err := a.Renew(ctx, "renewed", rc.Owner, ttl); err != nil {
			t.Errorf("Renew between the read and the break: %v", err)
		}
	})
	hi, err = admin.ForceRelease(ctx, "renewed", "operator")
	if err != nil || hi.Fence != gc.Fence {
		t.Fatalf("ForceRelease across a renewal = %+v, %v; want the grant read, fence %d", hi, err, gc.Fence)
	}
	if err := a.Renew(ctx, "renewed", rc.Owner, ttl); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Renew after the force release = %v, want ErrLeaseLost", err)
	}

	// The grant read is released and the next grant is half-way (its
	// lease acquired, its metadata not yet written: the ETag has not
	// moved) when the break lands: the break ends that lease, and the
	// half-way grant is never granted.
	rh := req("halfway", ttl)
	gh := grant(t, a, rh)
	y := newInterposer(t)
	c, err := azblobdriver.New(containerClient(t, az, "force-race", y), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	acquired, broken := make(chan struct{}), make(chan struct{})
	y.afterNextLeaseAcquire(func() { close(acquired); <-broken })
	type result struct {
		g   driver.Grant
		err error
	}
	next := make(chan result, 1)
	x.afterNextRead(func() {
		if err := a.Release(ctx, "halfway", rh.Owner); err != nil {
			t.Errorf("Release: %v", err)
		}
		go func() {
			g, err := c.TryAcquire(ctx, req("halfway", ttl))
			next <- result{g, err}
		}()
		<-acquired
	})
	hi, err = admin.ForceRelease(ctx, "halfway", "operator")
	close(broken)
	if err != nil || hi.Fence != gh.Fence {
		t.Errorf("ForceRelease across a half-way grant = %+v, %v; want the grant read, fence %d", hi, err, gh.Fence)
	}
	if res := <-next; !errors.Is(res.err, driver.ErrNotAcquired) {
		t.Fatalf("the half-way grant whose lease was broken = %+v, %v; want ErrNotAcquired", res.g, res.err)
	}
	if _, err := a.Inspect(ctx, "halfway"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect after the half-way grant failed = %v, want ErrNotAcquired (free)", err)
	}
}

// breakingAnswerer answers renewals and releases (Lease Blob, renew or
// release) with the service's 409 for a lease that is being broken, in
// place of the service, and passes every other request through.
type breakingAnswerer struct {
	hc   *http.Client
	code string
}

func (x *breakingAnswerer) Do(r *http.Request) (*http.Response, error) {
	if act := leaseAction(r); act != "renew" && act != "release" {
		return x.hc.Do(r)
	}
	body := fmt.Sprintf(`<?xml version="1.0" encoding="utf-8"?><Error><Code>%s</Code><Message>The lease ID matched, but the lease is currently in breaking state and cannot be changed.</Message></Error>`, x.code)
	h := http.Header{}
	h.Set("Content-Type", "application/xml")
	h.Set("x-ms-error-code", x.code)
	return &http.Response{
		Status: "409 Conflict", StatusCode: http.StatusConflict, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader([]byte(body))), ContentLength: int64(len(body)), Request: r,
	}, nil
}

// testBreakingLeaseIsLost: a lease being broken (a break with a break
// period, which Azurite holds in the breaking state) is lost for its
// holder: renewals and releases the service refuses with "lease is
// breaking" are ErrLeaseLost (never a store outage, which the root
// package would retry until the validity deadline, and report as
// ErrUnavailable), and another owner's acquisition is ErrNotAcquired.
//
// Azurite answers a renewal of a breaking lease with
// LeaseIsBrokenAndCannotBeRenewed and lets a release through; the Blob
// service may answer LeaseIsBreakingAndCannotBeChanged or
// LeaseIsBreakingAndCannotBeAcquired, so those answers are put in
// Azurite's place by the transport while the lease is really breaking.
func testBreakingLeaseIsLost(t *testing.T, az *testservers.Azurite) {
	const ttl = 2 * time.Second
	ctx := t.Context()
	a := open(t, az.URL("breaking"))
	b := open(t, az.URL("breaking"))
	for i, code := range []string{"LeaseIsBreakingAndCannotBeChanged", "LeaseIsBreakingAndCannotBeAcquired"} {
		key := fmt.Sprintf("breaking-%d", i)
		r := req(key, ttl)
		grant(t, a, r)
		lc, err := lease.NewBlobClient(containerClient(t, az, "breaking", nil).NewBlobClient(fmt.Sprintf("%x", key)), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lc.BreakLease(ctx, &lease.BlobBreakOptions{BreakPeriod: to.Ptr(int32(10))}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.TryAcquire(ctx, req(key, ttl)); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("TryAcquire of a breaking lease = %v, want ErrNotAcquired", err)
		}
		// Azurite itself: the holder's renewal is refused as lost.
		if err := a.Renew(ctx, key, r.Owner, ttl); !errors.Is(err, driver.ErrLeaseLost) {
			t.Fatalf("Renew of a breaking lease (Azurite's answer) = %v, want ErrLeaseLost", err)
		}
		x := &breakingAnswerer{hc: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}, code: code}
		t.Cleanup(x.hc.CloseIdleConnections)
		h, err := azblobdriver.New(containerClient(t, az, "breaking", x), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		err = h.Renew(ctx, key, r.Owner, ttl)
		if !errors.Is(err, driver.ErrLeaseLost) || errors.Is(err, driver.ErrUnavailable) {
			t.Errorf("Renew answered %s = %v, want ErrLeaseLost", code, err)
		}
		err = h.Release(ctx, key, r.Owner)
		if !errors.Is(err, driver.ErrLeaseLost) || errors.Is(err, driver.ErrUnavailable) {
			t.Errorf("Release answered %s = %v, want ErrLeaseLost", code, err)
		}
	}
}

// testCorruptFenceIsPermanent: a lock blob whose fence counter does not
// parse, or cannot advance (2^64 − 1: the next fence would wrap to 0), is
// refused with ErrInvalidArgument, a permanent fault of the blob, never
// ErrUnavailable (WithFailOpen would run the job unlocked on it) and
// never a grant with fence 0; the blob is left as it was.
func testCorruptFenceIsPermanent(t *testing.T, az *testservers.Azurite) {
	ctx := t.Context()
	d := open(t, az.URL("corrupt"))
	c := containerClient(t, az, "corrupt", nil)
	for _, fence := range []string{"seven", "18446744073709551615"} {
		key := "corrupt-" + fence
		name := fmt.Sprintf("%x", key)
		if _, err := c.NewBlockBlobClient(name).Upload(ctx, streaming.NopCloser(strings.NewReader("")), &blockblob.UploadOptions{
			Metadata: map[string]*string{"dlockfence": to.Ptr(fence)},
		}); err != nil {
			t.Fatal(err)
		}
		g, err := d.TryAcquire(ctx, req(key, time.Second))
		if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) {
			t.Errorf("TryAcquire of a blob with fence counter %q = %+v, %v; want ErrInvalidArgument, not ErrUnavailable", fence, g, err)
		}
		props, err := c.NewBlobClient(name).GetProperties(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if props.LeaseState != nil && *props.LeaseState != lease.StateTypeAvailable {
			t.Errorf("the blob with fence counter %q was leased: %v", fence, *props.LeaseState)
		}
	}
}
