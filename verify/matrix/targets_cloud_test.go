package matrix

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/verify"
)

// TestStore_RunTTL: a store's TTL raises the run's TTL and stretches its
// duration by the same factor; a store without one, or with one the
// matrix's TTL already covers, runs at the matrix's.
func TestStore_RunTTL(t *testing.T) {
	o := Options{TTL: time.Second, Duration: 12 * time.Second}
	for _, tc := range []struct {
		store, want, wantD time.Duration
		o                  Options
	}{
		{0, time.Second, 12 * time.Second, o},
		{3 * time.Second, 3 * time.Second, 36 * time.Second, o},
		{15 * time.Second, 15 * time.Second, 180 * time.Second, o},
		{500 * time.Millisecond, time.Second, 12 * time.Second, o},
		{3 * time.Second, 5 * time.Second, 60 * time.Second, Options{TTL: 5 * time.Second, Duration: 60 * time.Second}},
		{3 * time.Second, 3 * time.Second, 12 * time.Second, Options{Duration: 12 * time.Second}}, // no matrix TTL: nothing to scale by
	} {
		ttl, d := Store{TTL: tc.store}.runTTL(tc.o)
		if ttl != tc.want || d != tc.wantD {
			t.Errorf("Store{TTL: %v}.runTTL(TTL %v, Duration %v) = %v, %v; want %v, %v", tc.store, tc.o.TTL, tc.o.Duration, ttl, d, tc.want, tc.wantD)
		}
		// The fault schedule needs 5 TTLs; scaling keeps the ratio.
		if tc.o.TTL > 0 && d/ttl != tc.o.Duration/tc.o.TTL {
			t.Errorf("Store{TTL: %v}: %v / %v is not the matrix's %v / %v", tc.store, d, ttl, tc.o.Duration, tc.o.TTL)
		}
	}
	for _, name := range []string{"gcs", "azblob"} {
		i := slices.IndexFunc(Stores, func(s Store) bool { return s.Name == name })
		if i < 0 || Stores[i].TTL <= time.Second {
			t.Errorf("store %s: want a TTL above the matrix's 1 s in Stores", name)
		}
	}
}

// TestWriteGuarantees_StoreTTL: a store whose runs use a TTL of their own
// says so under its heading; the others say nothing.
func TestWriteGuarantees_StoreTTL(t *testing.T) {
	rep := &Report{
		Options: Options{TTL: time.Second, Duration: 12 * time.Second},
		Stores:  []Store{{Name: "slow", Doc: "a slow store", TTL: 3 * time.Second}, {Name: "quick", Doc: "a quick store"}},
	}
	var b bytes.Buffer
	if err := WriteGuarantees(&b, rep); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	if !strings.Contains(md, "## slow\n\na slow store. TTL 3s (runs of 36s).\n\n") {
		t.Errorf("the slow store's section does not give its TTL:\n%s", md)
	}
	if !strings.Contains(md, "## quick\n\na quick store.\n\n") {
		t.Errorf("the quick store's section is not its Doc line alone:\n%s", md)
	}
}

// TestCloudTargets: each cloud store of the grid starts, its clients'
// URL names the verifier's proxy and not the server, the proxy carries
// their traffic (a grant through it, nothing while it holds), and a
// Killer's kill stops the store and its restart brings it back with the
// grant made before (so the kill cells test a crash on the same data).
func TestCloudTargets(t *testing.T) {
	for _, name := range []string{"consul", "dynamodb", "gcs", "azblob"} {
		t.Run(name, func(t *testing.T) {
			i := slices.IndexFunc(Stores, func(s Store) bool { return s.Name == name })
			if i < 0 {
				t.Fatalf("no store %s in Stores", name)
			}
			s := Stores[i]
			h := testservers.NewHarness(t.Logf)
			defer h.Close()
			var target verify.Target
			if err := h.Run(func() { target = s.Start(h, 1) }); err != nil {
				t.Fatal(err)
			}
			if target.Name() != name {
				t.Errorf("Name() = %q, want %q", target.Name(), name)
			}
			links := target.(verify.Linked).Links()
			if len(links) != 1 {
				t.Fatalf("%d links, want 1", len(links))
			}
			p := links[0]
			if !strings.Contains(target.URL(), p.Addr()) && !strings.Contains(target.URL(), url.QueryEscape(p.Addr())) {
				t.Fatalf("URL %s does not name the proxy %s", target.URL(), p.Addr())
			}
			if strings.Contains(target.URL(), p.Target()) || strings.Contains(target.URL(), url.QueryEscape(p.Target())) {
				t.Fatalf("URL %s names the server %s itself", target.URL(), p.Target())
			}

			ttl, _ := s.runTTL(Options{TTL: time.Second, Duration: 12 * time.Second})
			ttl = max(ttl, 20*time.Second) // outlives the kill below on every store
			d := openTarget(t, target)
			a := driver.AcquireRequest{Key: "probe:a", Owner: "owner-a", TTL: ttl, Holder: "TestCloudTargets"}
			g, err := d.TryAcquire(t.Context(), a)
			if err != nil || g.Fence == 0 {
				t.Fatalf("TryAcquire through the proxy = %+v, %v", g, err)
			}
			if st := p.Stats(); st.Conns == 0 || st.Bytes[0] == 0 || st.Bytes[1] == 0 {
				t.Fatalf("the grant did not pass through the proxy: %+v", st)
			}

			// Held: nothing reaches the store.
			p.Hold()
			ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
			_, err = d.TryAcquire(ctx, driver.AcquireRequest{Key: "probe:held", Owner: "owner-a", TTL: ttl})
			cancel()
			p.Release()
			p.Cut()
			if err == nil {
				t.Fatal("TryAcquire succeeded while the proxy held every byte")
			}

			k, ok := target.(verify.Killer)
			if name == "gcs" {
				if ok {
					t.Fatal("gcs is a Killer: the in-process fake cannot be killed")
				}
				return
			}
			if !ok {
				t.Fatalf("%s is not a verify.Killer", name)
			}
			if name == "azblob" {
				// Azurite saves its metadata every 5 s: wait for the grant
				// to be on disk, so that this checks the restart, not the
				// documented loss of the last seconds.
				time.Sleep(6 * time.Second)
			}
			if err := k.Kill(t.Context()); err != nil {
				t.Fatal(err)
			}
			ctx, cancel = context.WithTimeout(t.Context(), 2*time.Second)
			_, err = d.TryAcquire(ctx, driver.AcquireRequest{Key: "probe:dead", Owner: "owner-a", TTL: ttl})
			cancel()
			if err == nil {
				t.Fatal("TryAcquire succeeded while the store was killed")
			}
			if err := k.Restart(t.Context()); err != nil {
				t.Fatal(err)
			}
			d2 := openTarget(t, target)
			b := a
			b.Owner = "owner-b"
			if name == "azblob" {
				// Azurite 3.37.0 keeps blobs and their metadata (the fence
				// counter) across a restart, graceful or not, but no lease:
				// every lease is gone afterwards. So the key is free, and
				// what must have survived is its fence.
				g2, err := retryStore(t, func(ctx context.Context) (driver.Grant, error) { return d2.TryAcquire(ctx, b) })
				if err == nil && g2.Fence <= g.Fence {
					t.Fatalf("after the restart, the fence went from %d to %d: the emulator's data did not survive", g.Fence, g2.Fence)
				}
				if err == nil {
					t.Logf("Azurite lost the lease in the restart (fence %d, then %d)", g.Fence, g2.Fence)
					return
				}
				if !errors.Is(err, driver.ErrNotAcquired) {
					t.Fatalf("after the restart, another owner's TryAcquire = %v", err)
				}
			} else if _, err := retryStore(t, func(ctx context.Context) (driver.Grant, error) { return d2.TryAcquire(ctx, b) }); !errors.Is(err, driver.ErrNotAcquired) {
				// The grant made before the kill holds the key still.
				t.Fatalf("after the restart, another owner's TryAcquire of the held key = %v, want ErrNotAcquired", err)
			}
			if _, err := retryStore(t, func(ctx context.Context) (driver.Grant, error) { return driver.Grant{}, d.Release(ctx, a.Key, a.Owner) }); err != nil {
				t.Fatalf("after the restart, the holder's Release = %v", err)
			}
			g2, err := retryStore(t, func(ctx context.Context) (driver.Grant, error) { return d2.TryAcquire(ctx, b) })
			if err != nil || g2.Fence <= g.Fence {
				t.Fatalf("after the release, TryAcquire = %+v, %v; want a fence above %d", g2, err, g.Fence)
			}
		})
	}
}

// openTarget opens a driver on target's URL, closed when the test ends.
func openTarget(t *testing.T, target verify.Target) driver.Driver {
	t.Helper()
	u, err := url.Parse(target.URL())
	if err != nil {
		t.Fatal(err)
	}
	open, err := driver.Lookup(u.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d, err := open(ctx, u)
	if err != nil {
		t.Fatalf("open %s: %v", target.URL(), err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// retryStore calls fn until it returns something other than a store
// error (connections cut by the restart fail their next request), for up
// to 10 s.
func retryStore(t *testing.T, fn func(context.Context) (driver.Grant, error)) (driver.Grant, error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		g, err := fn(ctx)
		cancel()
		if err == nil || errors.Is(err, driver.ErrNotAcquired) || errors.Is(err, driver.ErrLeaseLost) || time.Now().After(deadline) {
			return g, err
		}
		t.Logf("retrying after a store error: %v", err)
		time.Sleep(200 * time.Millisecond)
	}
}
