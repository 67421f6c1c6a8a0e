package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"

	_ "github.com/dlock-dev/dlock/drivers/redisdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestRun_BaselineBesideTheStores: with RawRedisAddr and LimitsDir, one
// run measures the machine's limits and raw Redis (go-redis alone) beside
// the dlock Redis driver on the same server, and the Markdown carries each
// store's ratio to raw Redis and W2's ratio to the disk's handoff limit.
func TestRun_BaselineBesideTheStores(t *testing.T) {
	r := testservers.StartRedis(t)
	rep, err := Run(t.Context(), Config{
		Stores: []string{r.URL()}, Clients: []int{1, 4}, ContendedClients: []int{4},
		Duration: 300 * time.Millisecond, SkipHold: true,
		RawRedisAddr: r.Addr(), LimitsDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	b := rep.Baseline
	if b == nil {
		t.Fatal("no baseline")
	}
	if l := b.Limits; l.LoopbackRTTP50Us <= 0 || l.LoopbackRTTP99Us < l.LoopbackRTTP50Us || l.FsyncP50Us <= 0 || l.FsyncP99Us < l.FsyncP50Us || l.HandoffLimit() <= 0 {
		t.Errorf("limits %+v", l)
	}
	if len(b.RawRedis) != 2 || len(b.RawRedisContended) != 1 {
		t.Fatalf("baseline shape %+v", b)
	}
	for _, c := range b.RawRedis {
		if c.Store != "raw-redis" || c.CyclesPerSec <= 0 || c.AcquireP50Us <= 0 || c.Errors != 0 {
			t.Errorf("raw W1 %+v", c)
		}
	}
	if c := b.RawRedisContended[0]; c.HandoffsPerSec <= 0 || c.Fairness <= 0 || c.Fairness > 1 || c.Errors != 0 {
		t.Errorf("raw W2 %+v", c)
	}
	if c := rep.Contended[0]; c.Fairness <= 0 || c.Fairness > 1 {
		t.Errorf("W2 fairness %+v", c)
	}
	var buf bytes.Buffer
	rep.Markdown(&buf)
	for _, want := range []string{"### Baseline", "loopback TCP round trip", "fdatasync", "| W1 | 4 |", "| W2 | 4 |", "× raw Redis", "× disk limit", "| redis | 4 |"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, buf.String())
		}
	}
	if !strings.Contains(buf.String(), "×") || strings.Count(buf.String(), "×") < 6 {
		t.Errorf("markdown lacks the ratios:\n%s", buf.String())
	}
}

func TestJain(t *testing.T) {
	for _, tc := range []struct {
		x    []int
		want float64
	}{
		{[]int{5, 5, 5, 5}, 1},
		{[]int{20, 0, 0, 0}, 0.25},
		{[]int{0, 0}, 0},
		{[]int{3, 1}, 0.8},
	} {
		if got := jain(tc.x); got < tc.want-1e-9 || got > tc.want+1e-9 {
			t.Errorf("jain(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
}
