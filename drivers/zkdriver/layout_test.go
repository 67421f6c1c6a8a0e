package zkdriver_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/zkdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// openRoot opens a driver on root of z, closed at the end of the test.
func openRoot(t *testing.T, z *testservers.ZooKeeper, root string) *zkdriver.Driver {
	t.Helper()
	d, err := openRootErr(t.Context(), z, root)
	if err != nil {
		t.Fatalf("Open(%s): %v", root, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func openRootErr(ctx context.Context, z *testservers.ZooKeeper, root string) (*zkdriver.Driver, error) {
	u, err := url.Parse("zk://" + z.Addr() + root + fmt.Sprintf("?session_timeout=%s&op_timeout=1s", sessionTimeout))
	if err != nil {
		return nil, err
	}
	return zkdriver.Open(ctx, u, nil)
}

func listKeys(t *testing.T, d *zkdriver.Driver, prefix string) []string {
	t.Helper()
	infos, err := d.List(t.Context(), prefix)
	if err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	keys := []string{}
	for _, in := range infos {
		keys = append(keys, in.Key)
	}
	return keys
}

// TestRoot_DeploymentsAreIndependent replays the nested-root fault:
// deployment I on "/team/app" holding "k" made deployment O on "/team" see
// its key "app" as held (List showed it, TryAcquire said "lock held", and
// Acquire waited until ZooKeeper removed I's empty container, long after I
// had released and closed). Deployments with different roots, nested or
// sharing a string prefix, must not see each other at all.
func TestRoot_DeploymentsAreIndependent(t *testing.T) {
	z := testservers.StartZooKeeper(t)
	for _, tc := range []struct {
		name         string
		inner, outer string
	}{
		{"Nested", "/n/team/app", "/n/team"},
		{"NestedDeeper", "/d/org/team/app", "/d/org"},
		{"StringPrefix", "/s/team2", "/s/team"},
		{"StringPrefixReversed", "/r/team", "/r/team2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			inner := openRoot(t, z, tc.inner)
			outer := openRoot(t, z, tc.outer)
			rel := strings.TrimPrefix(strings.TrimPrefix(tc.inner, tc.outer), "/")
			outerKeys := []string{rel, rel + "/k", "k", ".locks", ".locks/k"}

			ri := req("k")
			if _, err := inner.TryAcquire(ctx, ri); err != nil {
				t.Fatalf("inner TryAcquire(k): %v", err)
			}
			if got := listKeys(t, outer, ""); len(got) != 0 {
				t.Errorf("outer List(\"\") = %q while only the inner deployment holds a key", got)
			}
			fences := map[string]uint64{}
			for i, k := range outerKeys {
				if _, err := outer.Inspect(ctx, k); !errors.Is(err, driver.ErrNotAcquired) {
					t.Errorf("outer Inspect(%q) = %v, want ErrNotAcquired", k, err)
				}
				var g driver.Grant
				var err error
				if i%2 == 0 {
					g, err = outer.TryAcquire(ctx, req(k))
				} else {
					// Wait is granted at once too: nobody holds k here.
					wctx, cancel := context.WithTimeout(ctx, time.Second)
					g, err = outer.Wait(wctx, req(k))
					cancel()
				}
				if err != nil {
					t.Fatalf("outer acquire %q while the inner deployment holds %q: %v", k, "k", err)
				}
				fences[k] = g.Fence
			}
			if got := listKeys(t, inner, ""); fmt.Sprint(got) != "[k]" {
				t.Fatalf("inner List(\"\") = %q, want only its own [k]", got)
			}
			if err := inner.Release(ctx, "k", ri.Owner); err != nil {
				t.Fatalf("inner Release: %v", err)
			}
			if err := inner.Close(); err != nil {
				t.Fatal(err)
			}
			got := listKeys(t, outer, "")
			want := append([]string(nil), outerKeys...)
			sort.Strings(want)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("outer List(\"\") = %q, want only its own %q", got, want)
			}
			for _, k := range outerKeys {
				info, err := outer.Inspect(ctx, k)
				if err != nil || info.Fence != fences[k] || info.Waiters != 0 {
					t.Fatalf("outer Inspect(%q) = %+v, %v; want its own grant, fence %d, no waiters", k, info, err, fences[k])
				}
			}
		})
	}
}

// TestRoot_ReservedNamesAreRefused checks that no root can reach into
// another root's key nodes: a path element starting with "." is refused,
// and the key ".locks" is an ordinary, escaped key.
func TestRoot_ReservedNamesAreRefused(t *testing.T) {
	z := testservers.StartZooKeeper(t)
	for _, root := range []string{"/team/.locks", "/team/.locks/x", "/.dlock"} {
		d, err := openRootErr(t.Context(), z, root)
		if err == nil {
			d.Close()
			t.Errorf("Open with root %q succeeded", root)
		}
	}
	d := openRoot(t, z, "/team")
	r := req(".locks")
	if _, err := d.TryAcquire(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	raw, _, err := zk.Connect([]string{z.Addr()}, sessionTimeout, zk.WithLogInfo(false), zk.WithLogger(nopLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	children, _, err := raw.Children("/team/.locks/%2Elocks")
	if err != nil || len(children) != 1 || !strings.HasPrefix(children[0], r.Owner+"-") {
		t.Fatalf("children of /team/.locks/%%2Elocks = %q, %v; want the node of key .locks", children, err)
	}
	if got := listKeys(t, d, "."); fmt.Sprint(got) != "[.locks]" {
		t.Fatalf("List(\".\") = %q", got)
	}
	if err := d.Release(t.Context(), ".locks", r.Owner); err != nil {
		t.Fatal(err)
	}
}
