package azblobdriver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/azblobdriver"
	"github.com/dlock-dev/dlock/drivers/internal/resumetest"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestResume checks driver.Resumer against Azurite: a grant made through
// one client is resumed through another, as by a restarted process. The
// shortest blob lease is 15 s, so the checks end a grant by breaking its
// lease (ForceRelease), as the conformance harness's ForceExpiry does.
func TestResume(t *testing.T) {
	az := testservers.StartAzurite(t)
	t.Run("ServiceExpiry", func(t *testing.T) {
		t.Parallel()
		testResumeAfterServiceExpiry(t, az)
	})
	t.Run("Kit", func(t *testing.T) {
		t.Parallel()
		testResumeKit(t, az)
	})
}

func testResumeKit(t *testing.T, az *testservers.Azurite) {
	freezer := testservers.NewFreezer(t, func() []int { return []int{az.PID()} })
	open := func(ctx context.Context) (*azblobdriver.Driver, error) {
		return azblobdriver.Open(ctx, az.URL("resume"))
	}
	resumetest.Run(t, resumetest.Harness{
		NoStoreExpiryReason: "the shortest Azure blob lease is 15 s: ServiceExpiry checks a Resume after it, in parallel",
		Freeze:              freezer.Freeze,
		Thaw:                freezer.Thaw,
		Open:                func(ctx context.Context) (driver.Driver, error) { return open(ctx) },
		TTL:                 time.Second,
		End: func(t *testing.T, req driver.AcquireRequest) {
			admin, err := open(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close()
			if _, err := admin.ForceRelease(t.Context(), req.Key, "resumetest"); err != nil {
				t.Fatalf("ForceRelease(%q): %v", req.Key, err)
			}
		},
	})
	t.Run("TTLLongerThanTheServiceLeaseIsInvalid", func(t *testing.T) {
		a, err := open(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := open(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		r := driver.AcquireRequest{Key: "resume-ttl", Owner: resumetest.Owner(), TTL: time.Second}
		g, err := a.TryAcquire(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		// Served by a 15 s service lease: 15 s is fine, 16 s is not.
		r.TTL = azblobdriver.MinServiceLease
		if _, err := b.Resume(t.Context(), r, g.Fence); err != nil {
			t.Fatalf("Resume with the service lease's TTL: %v", err)
		}
		r.TTL = azblobdriver.MinServiceLease + time.Second
		if _, err := b.Resume(t.Context(), r, g.Fence); !errors.Is(err, driver.ErrInvalidTTL) {
			t.Fatalf("Resume with a TTL longer than the service lease = %v, want ErrInvalidTTL", err)
		}
		r.TTL = 2 * azblobdriver.MaxTTL
		if _, err := b.Resume(t.Context(), r, g.Fence); !errors.Is(err, driver.ErrInvalidTTL) {
			t.Fatalf("Resume with a TTL over MaxTTL = %v, want ErrInvalidTTL", err)
		}
		if err := a.Release(t.Context(), r.Key, r.Owner); err != nil {
			t.Fatal(err)
		}
	})
}

// testResumeAfterServiceExpiry: a grant whose service lease (15 s) ran out
// is not resumed, though nobody took it: Resume looks at the lease state
// first and never renews an expired lease (which the service, and Azurite
// whatever the lease ID, would do). It takes 15 s: it runs in parallel
// with the other checks.
func testResumeAfterServiceExpiry(t *testing.T, az *testservers.Azurite) {
	a, err := azblobdriver.Open(t.Context(), az.URL("resume-expiry"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := azblobdriver.Open(t.Context(), az.URL("resume-expiry"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r := driver.AcquireRequest{Key: "service-expiry", Owner: resumetest.Owner(), TTL: time.Second}
	g, err := a.TryAcquire(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(azblobdriver.MinServiceLease + 15*time.Second)
	for {
		_, err := b.Inspect(t.Context(), r.Key)
		if errors.Is(err, driver.ErrNotAcquired) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the service lease did not expire")
		}
		time.Sleep(250 * time.Millisecond)
	}
	if _, err := b.Resume(t.Context(), r, g.Fence); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("Resume of an expired lease = %v, want ErrLeaseLost", err)
	}
	if _, err := b.Inspect(t.Context(), r.Key); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect after a refused Resume = %v, want ErrNotAcquired (nothing renewed)", err)
	}
}
