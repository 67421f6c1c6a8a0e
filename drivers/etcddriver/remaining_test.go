package etcddriver_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/etcddriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestInspector_RemainingIsTimeLeft: Inspect and List report the time left
// on the holder's etcd lease (LeaseTimeToLive), not the TTL it was granted
// with: more than 0, at most the TTL, and decreasing as time passes (`dlock
// list` showed LEFT 0s for a 60 s lease).
func TestInspector_RemainingIsTimeLeft(t *testing.T) {
	e := testservers.StartEtcd(t)
	d := openDriver(t, e.URL())
	ctx := t.Context()
	const ttl = 60 * time.Second
	for _, k := range []string{"left/a", "left/b"} {
		if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: k, Owner: "owner-" + k[5:] + "-0000", TTL: ttl, Holder: "h"}); err != nil {
			t.Fatal(err)
		}
	}
	read := func() (inspected, listed map[string]time.Duration) {
		inspected, listed = map[string]time.Duration{}, map[string]time.Duration{}
		for _, k := range []string{"left/a", "left/b"} {
			info, err := d.Inspect(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			inspected[k] = info.Remaining
		}
		infos, err := d.List(ctx, "left/")
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 2 {
			t.Fatalf("List = %+v, want 2 holders", infos)
		}
		for _, info := range infos {
			if info.TTL != ttl {
				t.Errorf("List %q: TTL %v, want %v", info.Key, info.TTL, ttl)
			}
			listed[info.Key] = info.Remaining
		}
		return inspected, listed
	}
	i1, l1 := read()
	for k := range i1 {
		for what, left := range map[string]time.Duration{"Inspect": i1[k], "List": l1[k]} {
			if left <= 0 || left > ttl {
				t.Errorf("%s %q: Remaining %v, want in (0, %v]", what, k, left, ttl)
			}
		}
	}
	time.Sleep(2100 * time.Millisecond) // etcd counts whole seconds
	i2, l2 := read()
	for k := range i2 {
		if i2[k] >= i1[k] || l2[k] >= l1[k] || i2[k] <= 0 || l2[k] <= 0 {
			t.Errorf("%q: Remaining went from %v (Inspect) / %v (List) to %v / %v over 2.1s; want it to decrease and stay > 0",
				k, i1[k], l1[k], i2[k], l2[k])
		}
	}
	t.Logf("left after acquire: %v, 2.1s later: %v", i1, i2)
}

// TestOpen_InvalidURLIsInvalidArgument: URLs the driver refuses match
// driver.ErrInvalidArgument, never driver.ErrUnavailable.
func TestOpen_InvalidURLIsInvalidArgument(t *testing.T) {
	e := testservers.StartEtcd(t)
	urls := []string{
		"etcd://127.0.0.1:99999",
		"etcd://" + e.Addr() + ",127.0.0.1:0",
		"etcd://",
		"etcd://" + e.Addr() + "?no_such=1",
		"etcd://" + e.Addr() + "?op_timeout=soon",
		"etcd://" + e.Addr() + "?dial_timeout=-1s",
		"etcd://" + e.Addr() + "/.locks",
		"redis://" + e.Addr(),
		// No endpoint defaults its host or port (issue 13 F5).
		"etcd://:" + strings.TrimPrefix(e.Addr(), "127.0.0.1:"),
		"etcd://127.0.0.1",
		"etcd://127.0.0.1:",
		"etcd://" + e.Addr() + ",:2379",
	}
	dlocktest.OpenURLRefuses(t, etcddriver.Open, urls...)
	dlocktest.RootOpenNotUnavailable(t, urls...)
}

// failingTTL is an etcd client whose LeaseTimeToLive calls fail, as in a
// partial outage where reads still answer.
type failingTTL struct{ etcddriver.Client }

func (failingTTL) TimeToLive(ctx context.Context, id clientv3.LeaseID, opts ...clientv3.LeaseOption) (*clientv3.LeaseTimeToLiveResponse, error) {
	return nil, errors.New("etcdserver: request timed out")
}

// TestInspector_TimeLeftUnknownIsAnError: when etcd cannot say how long a
// lease has left, Inspect and List fail (an outage) instead of reporting
// a made-up zero, which `dlock status` showed as "left: 0s".
func TestInspector_TimeLeftUnknownIsAnError(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	d, err := etcddriver.New(failingTTL{cli}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	ctx := t.Context()
	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: "left/x", Owner: "owner-x-0000", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if info, err := d.Inspect(ctx, "left/x"); err == nil || errors.Is(err, driver.ErrNotAcquired) {
		t.Errorf("Inspect with LeaseTimeToLive failing = %+v, %v; want a store error", info, err)
	}
	if infos, err := d.List(ctx, "left/"); err == nil {
		t.Errorf("List with LeaseTimeToLive failing = %+v; want a store error", infos)
	}
}
