package fence_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/fence"
)

// TestPackages_LinkOnlyTheClientTheyUse: importing fence links no store
// client, and neither does fencesql (pgx handles fit its interfaces);
// fenceredis links go-redis and not pgx. The imports are read with go list,
// so a new import anywhere below these packages is caught.
func TestPackages_LinkOnlyTheClientTheyUse(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to list the packages' dependencies: %v", err)
	}
	const mod = "github.com/dlock-dev/dlock/"
	for _, tc := range []struct {
		pkg     string
		allowed []string // every dependency outside the standard library
		banned  []string // prefixes
	}{
		{"fence", []string{mod + "driver", mod + "fence"}, nil},
		{"fence/fencesql", []string{mod + "driver", mod + "fence", mod + "fence/fencesql"}, nil},
		{"fence/fenceredis", nil, []string{"github.com/jackc/"}},
	} {
		out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", mod+tc.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", tc.pkg, err, out)
		}
		deps := strings.Fields(string(out))
		if !slices.Contains(deps, mod+tc.pkg) {
			t.Fatalf("go list -deps %s does not list the package itself: %q", tc.pkg, deps)
		}
		for _, d := range deps {
			if tc.allowed != nil && !slices.Contains(tc.allowed, d) {
				t.Errorf("%s depends on %s; it may depend only on the standard library and %q", tc.pkg, d, tc.allowed)
			}
			for _, b := range tc.banned {
				if strings.HasPrefix(d, b) {
					t.Errorf("%s depends on %s", tc.pkg, d)
				}
			}
		}
	}
}

// TestErrStaleFence_IsTheRootSentinel: one value at every layer, so
// errors.Is works whichever package the caller names.
func TestErrStaleFence_IsTheRootSentinel(t *testing.T) {
	if fence.ErrStaleFence != dlock.ErrStaleFence {
		t.Fatal("fence.ErrStaleFence is not dlock.ErrStaleFence")
	}
}
