package main_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestJSON_StoreSecretsMasked: the store URL in -o json output and the run
// report masks secret-looking query parameters (password=, token=), not
// only a user:password@ (url.URL.Redacted hid only that).
func TestJSON_StoreSecretsMasked(t *testing.T) {
	store := "redis://127.0.0.1:1?password=hunter2secret"
	report := filepath.Join(t.TempDir(), "report.json")
	res := dlock(t, store, "run", "-o", "json", "--report", report, "--retry-for", "0", "k", "--", "true")
	b, _ := os.ReadFile(report)
	st := dlock(t, store, "status", "-o", "json", "--retry-for", "0", "k")
	for what, out := range map[string]string{"run stderr": res.stderr, "run report": string(b), "status stdout": st.stdout, "status stderr": st.stderr} {
		if strings.Contains(out, "hunter2secret") {
			t.Errorf("%s shows the store's password: %s", what, out)
		}
	}
	if !strings.Contains(string(b), "xxxxx") {
		t.Errorf("run report %s: want the store named with its password masked", b)
	}
}
