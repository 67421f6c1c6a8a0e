package etcddriver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/netproxy"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestDriver_GiveUpDuringLeaseGrantLeavesNoLease: a caller whose ctx ends
// after etcd granted the lease but before the answer arrived (here: every
// reply delayed 1 s by a proxy, the ctx cancelled at 300 ms) gets its ctx's
// error at once, and the lease is revoked when the answer arrives. Before,
// it was left behind, holding no key, for its TTL (found by dlock bench's
// cleanup test after Ctrl-C).
func TestDriver_GiveUpDuringLeaseGrantLeavesNoLease(t *testing.T) {
	e := testservers.StartEtcd(t)
	proxy := netproxy.Start(t, e.Addr(), 1)
	cli := rawClient(t, e)
	d := openDriver(t, "etcd://"+proxy.Addr()+"?op_timeout=10s")
	if _, err := d.Inspect(t.Context(), "grant:warm-up"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect through the proxy: %v", err) // the connection is up before replies are delayed
	}
	leases := func() int {
		resp, err := cli.Leases(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Leases)
	}
	before := leases()

	proxy.SetDelay(netproxy.Downstream, time.Second, time.Second)
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(300*time.Millisecond, cancel)
	began := time.Now()
	_, err := d.TryAcquire(ctx, req("grant:gaveup", 30*time.Second))
	took := time.Since(began)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("TryAcquire with ctx cancelled before the grant's answer: %v, want context.Canceled", err)
	}
	if took > 2*time.Second {
		t.Fatalf("TryAcquire returned %v after its ctx was cancelled at 300ms", took)
	}
	// The lease etcd granted must be revoked once its answer arrives, well
	// within its 30 s TTL.
	deadline := time.Now().Add(5 * time.Second)
	for leases() != before {
		if time.Now().After(deadline) {
			t.Fatalf("%d leases 5 s after the cancel, %d before: the grant of a caller who gave up was left behind", leases(), before)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
