package matrix

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/server/servertest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	servertest.Cleanup()
	os.Exit(code)
}

// TestMatrix_Short runs the short matrix (every store, its main faults)
// against real servers: no cell may be UNSAFE or fail to run, and the
// cells where a store is documented to fail must say so.
// DLOCK_VERIFY_STORES (comma-separated) restricts it, for debugging.
func TestMatrix_Short(t *testing.T) {
	o := Options{Short: true, Logf: t.Logf}
	if s := os.Getenv("DLOCK_VERIFY_STORES"); s != "" {
		o.Stores = strings.Split(s, ",")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cells) == 0 {
		t.Fatal("no cell ran")
	}
	for _, c := range rep.Cells {
		t.Logf("%s × %s: %s %s", c.Store, c.Fault, c.Verdict, c.Reason)
		if c.Verdict == NotApplicable {
			t.Errorf("%s × %s is in the short matrix but n/a: %s", c.Store, c.Fault, c.Reason)
		}
		for _, r := range c.Runs {
			if r.Findings.Unsafe() {
				for _, v := range r.Findings.Violations {
					t.Logf("  %s", v)
				}
			}
			if r.Findings.Grants == 0 {
				t.Errorf("%s × %s: no grant in the whole run", c.Store, c.Fault)
			}
			if r.Findings.WritesAccepted == 0 {
				t.Errorf("%s × %s: no write accepted in the whole run", c.Store, c.Fault)
			}
		}
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
}
