package dynamodbdriver_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dynamodbdriver"
	"github.com/dlock-dev/dlock/internal/cli"
)

// testInspectHolderFenceTimeLeft: Inspect shows the holder, the fence, the
// TTL and an estimate of the time left; a free or released key is
// ErrNotAcquired.
func testInspectHolderFenceTimeLeft(t *testing.T, s *store) {
	a, b := s.open(t), s.open(t)
	const ttl = 5 * time.Second
	if _, err := b.Inspect(t.Context(), "k"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Inspect of a key never held = %v, want ErrNotAcquired", err)
	}
	r := req("k", ownerA, ttl)
	r.Holder = "worker 7 on host-a"
	g := mustGrant(t, a, r)
	info, err := b.Inspect(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != "k" || info.Fence != g.Fence || info.Holder != r.Holder || info.TTL != ttl ||
		info.Remaining <= 0 || info.Remaining > ttl || info.Waiters != -1 {
		t.Fatalf("Inspect = %+v; want key k, fence %d, holder %q, TTL %v, 0 < left <= TTL, waiters -1", info, g.Fence, r.Holder, ttl)
	}
	if err := a.Release(t.Context(), "k", ownerA); err != nil {
		t.Fatal(err)
	}
	info, err = b.Inspect(t.Context(), "k")
	if !errors.Is(err, driver.ErrNotAcquired) || info.Waiters != -1 {
		t.Fatalf("Inspect of a released key = %+v, %v; want ErrNotAcquired", info, err)
	}
	if _, err := b.Inspect(t.Context(), ""); !errors.Is(err, driver.ErrInvalidKey) {
		t.Fatalf("Inspect of an empty key = %v, want ErrInvalidKey", err)
	}
}

// testListPrefixSortedHeldOnly: List returns the held keys with a prefix,
// sorted by key bytes, without free keys or the epoch counter.
func testListPrefixSortedHeldOnly(t *testing.T, s *store) {
	d := s.open(t)
	keys := []string{"a/b", "a b", "a%b", "a_b", "aé", "a🔒", "b", "a/free"}
	for _, k := range keys {
		mustGrant(t, d, req(k, ownerA, time.Minute))
	}
	if err := d.Release(t.Context(), "a/free", ownerA); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"a", []string{"a b", "a%b", "a/b", "a_b", "aé", "a🔒"}},
		{"a/", []string{"a/b"}},
		{"b", []string{"b"}},
		{"zzz", nil},
		{"", []string{"a b", "a%b", "a/b", "a_b", "aé", "a🔒", "b"}},
	} {
		infos, err := d.List(t.Context(), tc.prefix)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, in := range infos {
			got = append(got, in.Key)
			if in.Fence == 0 || in.TTL != time.Minute || in.Waiters != -1 {
				t.Errorf("List entry %+v", in)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
	if _, ok := attrN(t, s.item(t, dynamodbdriver.EpochKey), "epoch"); !ok {
		t.Fatal("no epoch item: the List test proves nothing about it")
	}
}

// testForceReleaseFreesAndFences: ForceRelease frees a key whoever holds
// it and reports what it removed; the old holder's renewal is refused, the
// next grant's fence is greater; a free key is ErrNotAcquired.
func testForceReleaseFreesAndFences(t *testing.T, s *store) {
	a, op := s.open(t), s.open(t)
	g := mustGrant(t, a, req("k", ownerA, time.Minute))
	info, err := op.ForceRelease(t.Context(), "k", "holder known dead")
	if err != nil || info.Fence != g.Fence || info.Holder != "test "+ownerA {
		t.Fatalf("ForceRelease = %+v, %v; want ownerA's grant", info, err)
	}
	if err := a.Renew(t.Context(), "k", ownerA, time.Minute); !errors.Is(err, driver.ErrLeaseLost) {
		t.Fatalf("the old holder's Renew = %v, want ErrLeaseLost", err)
	}
	g2 := mustGrant(t, op, req("k", ownerB, time.Minute))
	if g2.Fence <= g.Fence {
		t.Fatalf("fence after the force release %d, not greater than %d", g2.Fence, g.Fence)
	}
	if _, err := op.ForceRelease(t.Context(), "free", "nothing"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("ForceRelease of a free key = %v, want ErrNotAcquired", err)
	}
}

// runCLI runs the dlock CLI in-process against s.
func runCLI(t *testing.T, s *store, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Main(t.Context(), append([]string{"--store", s.url()}, args...), strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// testCLIStatusListRelease: dlock status, list and release --force work on
// a DynamoDB store.
func testCLIStatusListRelease(t *testing.T, s *store) {
	t.Setenv("DLOCK_CONFIG", "")
	t.Setenv("XDG_CONFIG_HOME", t.TempDir()) // no configuration file
	d := s.open(t)
	r := req("settle:42", ownerA, 30*time.Second)
	r.Holder = "cron on host-a"
	g := mustGrant(t, d, r)

	code, out, errOut := runCLI(t, s, "status", "settle:42")
	if code != 0 || !strings.Contains(out, "held by:  cron on host-a") || !strings.Contains(out, fmt.Sprintf("fence:    %d", g.Fence)) ||
		!strings.Contains(out, "ttl:      30s") {
		t.Fatalf("dlock status = %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, s, "-o", "json", "status", "settle:42")
	var st struct {
		Key    string  `json:"key"`
		Fence  uint64  `json:"fence"`
		Holder string  `json:"holder"`
		Left   float64 `json:"left_seconds"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Fence != g.Fence || st.Holder != r.Holder || st.Left <= 0 || st.Left > 30 {
		t.Fatalf("dlock -o json status = %d %+v\n%s%s", code, st, out, errOut)
	}
	code, out, errOut = runCLI(t, s, "list", "settle:")
	if code != 0 || !strings.Contains(out, "settle:42") || !strings.Contains(out, "cron on host-a") {
		t.Fatalf("dlock list = %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, s, "release", "--force", "settle:42", "--reason", "test")
	if code != 0 {
		t.Fatalf("dlock release --force = %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, s, "status", "settle:42")
	if code != 0 || !strings.Contains(out, "settle:42: free") {
		t.Fatalf("dlock status after release --force = %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, s, "-o", "json", "list")
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("dlock -o json list of an empty table = %d\n%s%s", code, out, errOut)
	}
}
