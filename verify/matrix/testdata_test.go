package matrix

import (
	"compress/gzip"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/verify"
)

// Recorded histories, one per verdict, from real runs of dlock verify
// (testdata/README.md says where each came from). Each file is a
// verify.Result, gzipped, named STORE_FAULT_VERDICT.json.gz with the
// verdict's slug (see slugs).
var slugs = map[string]string{
	"safe":     Safe,
	"fenced":   SafeFenced,
	"expected": UnsafeExpected,
	"unsafe":   Unsafe,
}

func loadResult(t *testing.T, path string) *verify.Result {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var r verify.Result
	if err := json.NewDecoder(zr).Decode(&r); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if r.History == nil || r.Findings == nil {
		t.Fatalf("%s: no history or no findings", path)
	}
	return &r
}

// TestTestdata_Verdicts: checking each recorded history again gives the
// findings recorded with it (the checkers have not drifted), the cell it
// makes gets the verdict its name says, and the files cover every
// verdict and every safety checker.
func TestTestdata_Verdicts(t *testing.T) {
	paths, err := filepath.Glob("testdata/*.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	caught := map[string]bool{}
	for _, path := range paths {
		name := strings.TrimSuffix(filepath.Base(path), ".json.gz")
		parts := strings.Split(name, "_")
		if len(parts) != 3 || slugs[parts[2]] == "" {
			t.Errorf("%s: want STORE_FAULT_VERDICT.json.gz with a verdict of %v", path, slices.Sorted(maps.Keys(slugs)))
			continue
		}
		t.Run(name, func(t *testing.T) {
			r := loadResult(t, path)
			if r.Store != parts[0] || r.Faults != parts[1] {
				t.Fatalf("file says %s × %s, the result %s × %s", parts[0], parts[1], r.Store, r.Faults)
			}
			got, err := verify.Check(r.History, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := r.Findings
			type counts struct {
				Double, Early, Fence, StaleAcc, StaleRef, Grants int
				Lin                                              string
			}
			c := func(f *verify.Findings) counts {
				return counts{f.DoubleGrants, f.EarlyGrants, f.FenceViolations, f.StaleWritesAccepted, f.StaleWritesRefused, f.Grants, f.Linearizable}
			}
			if c(got) != c(want) {
				t.Errorf("checked again: %+v, recorded: %+v", c(got), c(want))
			}
			i := slices.IndexFunc(Stores, func(s Store) bool { return s.Name == r.Store })
			if i < 0 {
				t.Fatalf("store %q is not in the matrix", r.Store)
			}
			cell := &Cell{Store: r.Store, Fault: r.Faults, Runs: []*verify.Result{r}}
			judge(cell, Stores[i])
			if cell.Verdict != slugs[parts[2]] {
				t.Errorf("verdict %q (%s), want %q", cell.Verdict, cell.Reason, slugs[parts[2]])
			}
			seen[cell.Verdict] = true
			for what, n := range map[string]int{
				"double grants": got.DoubleGrants, "early grants": got.EarlyGrants,
				"fence violations": got.FenceViolations, "stale writes accepted": got.StaleWritesAccepted,
				"stale writes refused": got.StaleWritesRefused,
			} {
				if n > 0 {
					caught[what] = true
				}
			}
			if got.Linearizable == "illegal" {
				caught["not linearizable"] = true
			}
		})
	}
	for _, v := range slugs {
		if !seen[v] {
			t.Errorf("no history in testdata has the verdict %q", v)
		}
	}
	for _, what := range []string{"double grants", "early grants", "fence violations", "stale writes accepted", "stale writes refused", "not linearizable"} {
		if !caught[what] {
			t.Errorf("no history in testdata shows %s", what)
		}
	}
}
