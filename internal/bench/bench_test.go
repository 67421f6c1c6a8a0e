package bench

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	_ "github.com/dlock-dev/dlock/drivers/memdriver"
)

// TestMain checks for leaked goroutines. fake-gcs-server (the GCS store of
// BenchmarkSideBySide, in-process) links OpenCensus, whose package init
// starts a worker that runs for the life of the process.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

func TestRun_EveryWorkloadReportsFigures(t *testing.T) {
	cfg := Config{
		Stores: []string{"mem://bench-test"}, Clients: []int{1, 4}, ContendedClients: []int{4},
		Duration: 200 * time.Millisecond, HoldKeys: 2000,
		ServerPIDs: map[string]int{"mem://bench-test": os.Getpid()}, // the mem store lives in this process
	}
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Uncontended) != 2 || len(rep.Contended) != 1 || len(rep.Held) != 1 {
		t.Fatalf("report shape %+v", rep)
	}
	for _, c := range rep.Uncontended {
		if c.CyclesPerSec <= 0 || c.AcquireP50Us <= 0 || c.AcquireP99Us < c.AcquireP50Us || c.Errors != 0 {
			t.Errorf("W1 %+v", c)
		}
	}
	if c := rep.Contended[0]; c.HandoffsPerSec <= 0 || c.GapP99Us < c.GapP50Us || c.LongestWaitMs <= 0 || c.Errors != 0 {
		t.Errorf("W2 %+v", c)
	}
	if h := rep.Held[0]; h.Keys != 2000 || h.Errors != 0 || h.ServerRSSMiB <= 0 || h.AcquireSeconds <= 0 {
		t.Errorf("W3 %+v", h)
	}
	var buf bytes.Buffer
	rep.Markdown(&buf)
	for _, want := range []string{"### W1", "### W2", "### W3", "| mem://bench-test | 4 |"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestParsePIDs(t *testing.T) {
	m, err := ParsePIDs([]string{"redis://127.0.0.1:6379=42", "dlockd://h:1=7"})
	if err != nil || m["redis://127.0.0.1:6379"] != 42 || m["dlockd://h:1"] != 7 {
		t.Fatalf("%v %v", m, err)
	}
	for _, bad := range []string{"nopid", "x=abc", "x=-1"} {
		if _, err := ParsePIDs([]string{bad}); err == nil {
			t.Errorf("ParsePIDs(%q) accepted", bad)
		}
	}
}

// TestHoldCap: W3 on an emulator holds its cap and its row says why; other
// stores, and counts under the cap, hold what was asked for.
func TestHoldCap(t *testing.T) {
	for _, tc := range []struct {
		store      string
		asked, got int
		capped     bool
	}{
		{"gs://b/p?endpoint=http://127.0.0.1:1", 100_000, 2_000, true},
		{"azblob://acct/c", 100_000, 2_000, true},
		{"dynamodb://t?region=x", 100_000, 10_000, true},
		{"gs://b/p", 500, 500, false},
		{"dlockd://127.0.0.1:1", 100_000, 100_000, false},
		{"redis://127.0.0.1:1", 100_000, 100_000, false},
	} {
		got, why := holdCap(tc.store, tc.asked)
		if got != tc.got || (why != "") != tc.capped {
			t.Errorf("holdCap(%q, %d) = %d, %q; want %d, capped %v", tc.store, tc.asked, got, why, tc.got, tc.capped)
		}
	}
	var buf bytes.Buffer
	Report{Held: []Held{{Store: "gs://b/p", Keys: 2_000, AcquireSeconds: 1, Capped: "2000 of the 100000 asked for: slow"}}}.Markdown(&buf)
	if want := "| gs | 2000 (2000 of the 100000 asked for: slow) | 1.00 s |"; !strings.Contains(buf.String(), want) {
		t.Errorf("markdown lacks %q:\n%s", want, buf.String())
	}
}

// TestRun_ClientCountGivenTwice: a client count given twice is refused
// before anything runs: its two rows could not be told apart by the ratios,
// which are looked up by client count.
func TestRun_ClientCountGivenTwice(t *testing.T) {
	for _, c := range []Config{
		{Stores: []string{"dlockd://127.0.0.1:1"}, Clients: []int{1, 1}},
		{Stores: []string{"dlockd://127.0.0.1:1"}, Clients: []int{1}, ContendedClients: []int{8, 64, 8}},
	} {
		_, err := Run(t.Context(), c)
		if err == nil || !strings.Contains(err.Error(), "bench: client count") || !strings.Contains(err.Error(), "given twice") {
			t.Errorf("Run(clients %v, contended %v) = %v, want a client count given twice", c.Clients, c.ContendedClients, err)
		}
	}
}

// TestRun_DurationTooShort: a cell shorter than MinDuration is refused
// before any store is called (Touching is never called): it would end
// before its clients made a cycle and read zero. The default (zero) and
// MinDuration itself pass the check.
func TestRun_DurationTooShort(t *testing.T) {
	touched := false
	c := Config{Stores: []string{"dlockd://127.0.0.1:1"}, Duration: MinDuration - 1, Touching: func(string) { touched = true }}
	_, err := Run(t.Context(), c)
	if err == nil || !strings.Contains(err.Error(), "shorter than") || touched {
		t.Errorf("Run(duration %v) = %v (store touched: %v), want a refusal before any store call", c.Duration, err, touched)
	}
	for _, d := range []time.Duration{0, MinDuration} {
		if err := (Config{Duration: d}).Check(); err != nil {
			t.Errorf("Check(duration %v) = %v, want nil", d, err)
		}
	}
}

// TestMarkdown_BaselineBlankLines: whichever baselines a run measured, the
// Baseline section has one blank line between its blocks, never two.
func TestMarkdown_BaselineBlankLines(t *testing.T) {
	lim := Limits{LoopbackRTTP50Us: 20, LoopbackRTTP99Us: 40, FsyncP50Us: 200, FsyncP99Us: 400, FsyncDir: "/tmp"}
	redis := []Uncontended{{Store: "raw-redis", Clients: 1, CyclesPerSec: 1000}}
	etcd := []Uncontended{{Store: "raw-etcd", Clients: 1, CyclesPerSec: 500}}
	zk := []Uncontended{{Store: "raw-zk", Clients: 1, CyclesPerSec: 700}}
	for name, b := range map[string]Baseline{
		"etcd only":         {RawEtcd: etcd},
		"zk only":           {RawZK: zk},
		"limits and etcd":   {Limits: lim, RawEtcd: etcd},
		"redis and zk":      {RawRedis: redis, RawZK: zk},
		"every baseline":    {Limits: lim, RawRedis: redis, RawEtcd: etcd, RawZK: zk},
		"limits only":       {Limits: lim},
		"redis only, no W2": {RawRedis: redis},
	} {
		var buf bytes.Buffer
		Report{Baseline: &b, Uncontended: []Uncontended{{Store: "mem://x", Clients: 1, CyclesPerSec: 900}}}.Markdown(&buf)
		out := buf.String()
		if strings.Contains(out, "\n\n\n") {
			t.Errorf("%s: two blank lines in a row:\n%s", name, out)
		}
		if !strings.Contains(out, "### Baseline — this machine in this run\n\n") || !strings.Contains(out, "\n\n### W1") {
			t.Errorf("%s: want a blank line after the Baseline heading and before W1's:\n%s", name, out)
		}
	}
}
