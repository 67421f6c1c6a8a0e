package main

import (
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/internal/buildinfo"
)

// TestVersion_NamesDlockd: dlockd --version names dlockd, not the CLI
// (it printed "dlock ..."), and otherwise prints buildinfo's line.
func TestVersion_NamesDlockd(t *testing.T) {
	var out, errOut strings.Builder
	if code := run([]string{"--version"}, &out, &errOut); code != 0 {
		t.Fatalf("run --version: exit %d, stderr %q", code, errOut.String())
	}
	want := buildinfo.Read().Line("dlockd") + "\n"
	if out.String() != want || !strings.HasPrefix(out.String(), "dlockd ") {
		t.Fatalf("dlockd --version printed %q, want %q", out.String(), want)
	}
}
