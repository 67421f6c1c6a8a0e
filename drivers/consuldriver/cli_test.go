package consuldriver_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/internal/cli"
)

// runCLI runs the dlock command line (internal/cli, as the binary does)
// against store and returns its exit code and output.
func runCLI(t *testing.T, store string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Main(t.Context(), append([]string{"--store", store}, args...), strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// testCLI_StatusListRelease: dlock status, list and release --force work on
// a Consul store.
func testCLI_StatusListRelease(t *testing.T, f *fixture) {
	store := f.url("")
	if code, out, errs := runCLI(t, store, "status", "cli:key"); code != 0 || !strings.Contains(out, "free") {
		t.Fatalf("status of a free key: exit %d, %q %q", code, out, errs)
	}
	l, err := dlock.Open(t.Context(), store)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ls, err := l.TryAcquire(t.Context(), "cli:key", dlock.WithTTL(3*time.Second), dlock.WithHolder("cli-holder"))
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, store, "status", "-o", "json", "cli:key")
	var st struct {
		Key, Holder string
		Held        bool
		Fence       uint64
		TTL         float64 `json:"ttl_seconds"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || !st.Held || st.Holder != "cli-holder" || st.Fence != ls.Fence() || st.Key != "cli:key" || st.TTL != 3 {
		t.Fatalf("status json: exit %d, %q %q (%+v)", code, out, errs, st)
	}
	code, out, errs = runCLI(t, store, "list", "-o", "json", "cli:")
	var list []struct {
		Key   string
		Fence uint64
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].Key != "cli:key" || list[0].Fence != ls.Fence() {
		t.Fatalf("list json: exit %d, %q %q", code, out, errs)
	}
	if code, out, errs := runCLI(t, store, "list", "cli:"); code != 0 || !strings.Contains(out, "cli:key") || !strings.Contains(out, "cli-holder") {
		t.Fatalf("list: exit %d, %q %q", code, out, errs)
	}
	if code, out, errs := runCLI(t, store, "release", "--force", "--reason", "test", "cli:key"); code != 0 {
		t.Fatalf("release --force: exit %d, %q %q", code, out, errs)
	}
	select {
	case <-ls.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the force-released lease was not lost")
	}
	if code, out, errs := runCLI(t, store, "status", "cli:key"); code != 0 || !strings.Contains(out, "free") {
		t.Fatalf("status after release --force: exit %d, %q %q", code, out, errs)
	}
}
