package etcddriver_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/etcddriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// listKeys returns the keys d lists under prefix.
func listKeys(t *testing.T, d *etcddriver.Driver, prefix string) []string {
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

// TestPrefix_DeploymentsAreIndependent replays the nested-prefix fault:
// deployment I on "/team/app" holding "k" made deployment O on "/team" see
// its key "app" (and "app/k") as held. Deployments with different prefixes,
// nested or sharing a string prefix, must not see each other at all.
func TestPrefix_DeploymentsAreIndependent(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
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
			inner := openDriver(t, e.URL()+tc.inner)
			outer := openDriver(t, e.URL()+tc.outer)
			// The keys of the outer deployment that the old layout mixed
			// up with the inner deployment's entries, and reserved names.
			rel := strings.TrimPrefix(strings.TrimPrefix(tc.inner, tc.outer), "/")
			outerKeys := []string{rel, rel + "/k", "k", ".locks", ".locks/k"}

			ri := req("k", 5*time.Second)
			if _, err := inner.TryAcquire(ctx, ri); err != nil {
				t.Fatalf("inner TryAcquire(k): %v", err)
			}
			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err := inner.Wait(wctx, req("k", 5*time.Second)) // leaves nothing behind
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("inner Wait on a held key = %v, want a timeout", err)
			}
			if got := listKeys(t, outer, ""); len(got) != 0 {
				t.Errorf("outer List(\"\") = %q while only the inner deployment holds a key", got)
			}
			fences := map[string]uint64{}
			for _, k := range outerKeys {
				if _, err := outer.Inspect(ctx, k); !errors.Is(err, driver.ErrNotAcquired) {
					t.Errorf("outer Inspect(%q) = %v, want ErrNotAcquired", k, err)
				}
				g, err := outer.TryAcquire(ctx, req(k, 5*time.Second))
				if err != nil {
					t.Fatalf("outer TryAcquire(%q) while the inner deployment holds %q: %v", k, "k", err)
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
			// Nothing of the inner deployment is left on the store or
			// visible to the outer one.
			resp, err := cli.Get(ctx, tc.inner+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range resp.Kvs {
				t.Errorf("inner entry left: %s", kv.Key)
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

// TestPrefix_ReservedNamesAreRefused checks that no prefix can reach into
// another prefix's lock entries: a path element starting with "." is
// refused by Open and New, and the key ".locks" is an ordinary key.
func TestPrefix_ReservedNamesAreRefused(t *testing.T) {
	e := testservers.StartEtcd(t)
	cli := rawClient(t, e)
	for _, p := range []string{"/team/.locks", "/team/.locks/x", "/.dlock", "/team/./x", "/team/../x"} {
		u := mustParse(t, e.URL()+p)
		d, err := etcddriver.Open(t.Context(), u)
		if err == nil {
			d.Close()
			t.Errorf("Open with prefix %q succeeded", p)
		}
		if _, err := etcddriver.New(cli, &etcddriver.Options{Prefix: p}); err == nil {
			t.Errorf("New with prefix %q succeeded", p)
		}
	}
	for _, p := range []string{"/a.b", "/v1.2/locks", "/x/"} {
		d, err := etcddriver.Open(t.Context(), mustParse(t, e.URL()+p))
		if err != nil {
			t.Errorf("Open with prefix %q: %v", p, err)
			continue
		}
		d.Close()
	}
	// The key ".locks" of "/team" lives inside /team/.locks/, escaped so it
	// cannot be taken for the reserved name.
	d := openDriver(t, e.URL()+"/team")
	r := req(".locks", 5*time.Second)
	if _, err := d.TryAcquire(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(t.Context(), "/team/.locks/%2Elocks/"+r.Owner, clientv3.WithCountOnly())
	if err != nil || resp.Count != 1 {
		t.Fatalf("entry of key .locks: count %d, %v; want it at /team/.locks/%%2Elocks/<owner>", resp.Count, err)
	}
	if got := listKeys(t, d, "."); fmt.Sprint(got) != "[.locks]" {
		t.Fatalf("List(\".\") = %q", got)
	}
	if err := d.Release(t.Context(), ".locks", r.Owner); err != nil {
		t.Fatal(err)
	}
}

func mustParse(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
