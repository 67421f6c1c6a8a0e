package azblobdriver_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/azblobdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// ignoreOpenCensus: fake-gcs-server, which the dlock CLI links (through
// verify/matrix's gcs target), starts opencensus's view worker in an init.
var ignoreOpenCensus = goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, ignoreOpenCensus) }

// suiteTTL is the TTL of the suite's expiry subtests.
const suiteTTL = time.Second

// TestConformance runs the dlock conformance suite, and this driver's own
// tests, against Azurite's blob service: each driver opened by URL with its
// own HTTP transport, as a process would.
//
// Every conformance subtest runs once. Those that stop, restart or freeze
// the store (Store_*) run on an Azurite of their own, concurrently with the
// others and with the driver's tests on a shared one, because most of
// their time is spent waiting (for a restart, an op timeout, a service
// lease); Goroutines_NoLeak runs last, alone, since goroutines of tests
// running beside it would look like leaks.
//
// Azure's shortest blob lease is 15 s and the suite's TTL is 1 s (the
// driver serves it with a 15 s service lease: see ServiceLease). Three
// subtests (Expiry_TakeoverAfterBlockedRenewals,
// Release_LostLeaseLeavesSuccessor, Renewal_AfterTakeoverIsLeaseLost) stop
// a holder's renewals and wait for the store to end its grant; the harness's
// ForceExpiry makes the service do that when the holder's 1 s TTL has run
// out, by breaking the holder's lease then, as a 1 s service lease would,
// so that they do not wait 15 s each. ServiceExpiry checks the service's own
// expiry of a real 15 s lease; the link and frozen-store subtests wait for
// it too.
func TestConformance(t *testing.T) {
	az := testservers.StartAzurite(t)
	main := harness(t, az, "conformance")
	isStore := func(name string) bool { return strings.HasPrefix(name, "Store_") }
	const last = "Goroutines_NoLeak"
	t.Run("parallel", func(t *testing.T) {
		t.Run("Suite", func(t *testing.T) {
			t.Parallel()
			for _, st := range dlocktest.Subtests(main) {
				if !isStore(st.Name) && st.Name != last {
					t.Run(st.Name, func(t *testing.T) { st.Run(t) })
				}
			}
		})
		t.Run("SuiteStoreFaults", func(t *testing.T) {
			t.Parallel()
			own := testservers.StartAzurite(t)
			for _, st := range dlocktest.Subtests(harness(t, own, "conformance")) {
				if isStore(st.Name) {
					t.Run(st.Name, func(t *testing.T) { st.Run(t) })
				}
			}
		})
		t.Run("ServiceExpiry", func(t *testing.T) {
			t.Parallel()
			testServiceExpiry(t, az)
		})
		t.Run("Driver", func(t *testing.T) {
			t.Parallel()
			for _, tc := range driverTests {
				t.Run(tc.name, func(t *testing.T) { tc.fn(t, az) })
			}
		})
	})
	for _, st := range dlocktest.Subtests(main) {
		if st.Name == last {
			t.Run(st.Name, func(t *testing.T) { st.Run(t) })
		}
	}
}

// harness returns the conformance harness of container on az.
func harness(t *testing.T, az *testservers.Azurite, container string) dlocktest.Harness {
	freezer := testservers.NewFreezer(t, func() []int { return []int{az.PID()} })
	var bg sync.WaitGroup
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop); bg.Wait() })
	return dlocktest.Harness{
		Name: "azblob",
		NewDriver: func(ctx context.Context) (driver.Driver, error) {
			d, err := azblobdriver.Open(ctx, az.URL(container))
			if err != nil {
				return nil, err
			}
			return &tracked{Driver: d, grants: map[string]string{}}, nil
		},
		StopStore:   az.Stop,
		StartStore:  az.Start,
		FreezeStore: freezer.Freeze,
		ThawStore:   freezer.Thaw,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return azblobdriver.Open(ctx, testservers.AzuriteURL(via(az.Addr()), container))
		},
		TTL: suiteTTL,
		ForceExpiry: func(ctx context.Context, d driver.Driver) error {
			tr, ok := d.(*tracked)
			if !ok {
				return errors.New("ForceExpiry: not a driver of this harness")
			}
			keys := tr.held()
			at := time.Now().Add(suiteTTL + 50*time.Millisecond) // the holder's deadline has passed by then
			bg.Add(1)
			go func() {
				defer bg.Done()
				select {
				case <-time.After(time.Until(at)):
				case <-stop:
					return
				}
				// Until the 15 s service lease runs out nobody else can
				// hold these keys: the break ends the holder's grant.
				admin, err := azblobdriver.Open(context.Background(), az.URL(container))
				if err != nil {
					t.Errorf("ForceExpiry: %v", err)
					return
				}
				defer admin.Close()
				for _, k := range keys {
					if _, err := admin.ForceRelease(context.Background(), k, "dlocktest ForceExpiry"); err != nil && !errors.Is(err, driver.ErrNotAcquired) {
						t.Errorf("ForceExpiry: break %q: %v", k, err)
					}
				}
			}()
			return nil
		},
	}
}

// tracked is a driver that remembers the keys it holds, for ForceExpiry.
type tracked struct {
	*azblobdriver.Driver
	mu     sync.Mutex
	grants map[string]string // key → owner token
}

func (tr *tracked) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := tr.Driver.TryAcquire(ctx, req)
	if err == nil {
		tr.mu.Lock()
		tr.grants[req.Key] = req.Owner
		tr.mu.Unlock()
	}
	return g, err
}

// Resume records a resumed grant as TryAcquire records a new one.
func (tr *tracked) Resume(ctx context.Context, req driver.AcquireRequest, fence uint64) (driver.Grant, error) {
	g, err := tr.Driver.Resume(ctx, req, fence)
	if err == nil {
		tr.mu.Lock()
		tr.grants[req.Key] = req.Owner
		tr.mu.Unlock()
	}
	return g, err
}

func (tr *tracked) Release(ctx context.Context, key, owner string) error {
	err := tr.Driver.Release(ctx, key, owner)
	if err == nil || errors.Is(err, driver.ErrLeaseLost) {
		tr.mu.Lock()
		if tr.grants[key] == owner {
			delete(tr.grants, key)
		}
		tr.mu.Unlock()
	}
	return err
}

func (tr *tracked) held() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	keys := make([]string, 0, len(tr.grants))
	for k := range tr.grants {
		keys = append(keys, k)
	}
	return keys
}
