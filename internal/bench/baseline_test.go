package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	_ "github.com/dlock-dev/dlock/drivers/etcddriver"
	_ "github.com/dlock-dev/dlock/drivers/redisdriver"
	_ "github.com/dlock-dev/dlock/drivers/zkdriver"
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

// TestRun_RawRecipesBesideTheStores: with RawEtcdEndpoint and RawZKAddr,
// one run measures W1 with etcd's and ZooKeeper's official clients alone
// beside the dlock etcd and zk drivers on the same servers, the W1 rows of
// those stores carry "× raw recipe", and the raw cells leave nothing on
// the stores.
func TestRun_RawRecipesBesideTheStores(t *testing.T) {
	e := testservers.StartEtcd(t)
	z := testservers.StartZooKeeper(t)
	rep, err := Run(t.Context(), Config{
		Stores: []string{e.URL(), z.URL()}, Clients: []int{1, 4}, ContendedClients: []int{2},
		Duration: 300 * time.Millisecond, SkipHold: true,
		RawEtcdEndpoint: e.Addr(), RawZKAddr: z.Addr(),
	})
	if err != nil {
		t.Fatal(err)
	}
	b := rep.Baseline
	if b == nil {
		t.Fatal("no baseline")
	}
	if len(b.RawEtcd) != 2 || len(b.RawZK) != 2 || len(b.RawRedis) != 0 {
		t.Fatalf("baseline shape %+v", b)
	}
	for _, c := range append(b.RawEtcd, b.RawZK...) {
		if (c.Store != "raw-etcd" && c.Store != "raw-zk") || c.CyclesPerSec <= 0 || c.AcquireP50Us <= 0 || c.Errors != 0 {
			t.Errorf("raw recipe W1 %+v", c)
		}
	}
	var buf bytes.Buffer
	rep.Markdown(&buf)
	md := buf.String()
	for _, want := range []string{"raw etcd recipe", "raw ZooKeeper recipe", "| raw-etcd W1 | 4 |", "| raw-zk W1 | 4 |", "× raw recipe"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// Each etcd and zk W1 row has its ratio to the raw recipe: the 5th
	// column is a ratio.
	rows := 0
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "| etcd | ") && !strings.HasPrefix(line, "| zk | ") {
			continue
		}
		if cols := strings.Split(line, "|"); len(cols) == 10 { // a W1 row: 8 columns
			rows++
			if !strings.HasSuffix(strings.TrimSpace(cols[5]), "×") {
				t.Errorf("W1 row without × raw recipe: %s", line)
			}
		}
	}
	if rows != 4 {
		t.Errorf("%d etcd/zk W1 rows with 8 columns, want 4:\n%s", rows, md)
	}
	// Nothing of the raw cells is left on the stores.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if resp, err := cli.Get(t.Context(), "/dlock-bench-raw/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Errorf("raw etcd keys left: %v, %v", resp, err)
	}
	if ls, err := cli.Leases(t.Context()); err != nil || len(ls.Leases) != 0 {
		t.Errorf("etcd leases left after the run: %v, %v", ls, err)
	}
	conn, _, err := zk.Connect([]string{z.Addr()}, 5*time.Second, zk.WithLogInfo(false), zk.WithLogger(zkNoLog{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	children, _, err := conn.Children("/")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range children {
		if strings.HasPrefix(c, "dlock-bench-raw-") {
			t.Errorf("raw ZooKeeper node left: /%s", c)
		}
	}
}

// TestRun_PairedBaselines: with PairedBaselines, each W1 row carries the
// raw Redis cell run just before it (and an etcd row its raw recipe's),
// and its Markdown ratios are taken against those, with the raw figure
// named beside each ratio.
func TestRun_PairedBaselines(t *testing.T) {
	r := testservers.StartRedis(t)
	e := testservers.StartEtcd(t)
	rep, err := Run(t.Context(), Config{
		Stores: []string{r.URL(), e.URL()}, Clients: []int{1, 2}, ContendedClients: []int{2},
		Duration: 200 * time.Millisecond, SkipHold: true,
		RawRedisAddr: r.Addr(), RawEtcdEndpoint: e.Addr(), PairedBaselines: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Uncontended) != 4 {
		t.Fatalf("%d W1 rows, want 4", len(rep.Uncontended))
	}
	var buf bytes.Buffer
	rep.Markdown(&buf)
	md := buf.String()
	if !strings.Contains(md, "Each ratio is against the raw cell run just before this row's") {
		t.Errorf("markdown does not say the ratios are paired:\n%s", md)
	}
	for _, c := range rep.Uncontended {
		name := storeName(c.Store)
		if c.RawRedisBefore <= 0 {
			t.Errorf("%s W1 %d clients: no raw Redis cell before it (%+v)", name, c.Clients, c)
		}
		if wantRecipe := name == "etcd"; (c.RawRecipeBefore > 0) != wantRecipe {
			t.Errorf("%s W1 %d clients: raw recipe before it %v, want one: %v", name, c.Clients, c.RawRecipeBefore, wantRecipe)
		}
		// The row's ratios are against its own raw cells, which the
		// row names.
		row := fmt.Sprintf("| %s | %d | %.0f | %s | ", name, c.Clients, c.CyclesPerSec, pairedRatio(c.CyclesPerSec, c.RawRedisBefore, 0))
		if !strings.Contains(md, row) {
			t.Errorf("markdown lacks the row %q:\n%s", row, md)
		}
		if name == "etcd" && !strings.Contains(md, row+pairedRatio(c.CyclesPerSec, c.RawRecipeBefore, 0)+" |") {
			t.Errorf("etcd row %d clients lacks its ratio to the raw recipe run before it:\n%s", c.Clients, md)
		}
	}
}

func TestPairedRatio(t *testing.T) {
	for _, c := range []struct {
		v, before, base float64
		want            string
	}{
		{100, 400, 1000, "0.25× (400)"},
		{100, 0, 1000, "0.10×"},
		{100, 0, 0, ""},
	} {
		if got := pairedRatio(c.v, c.before, c.base); got != c.want {
			t.Errorf("pairedRatio(%v, %v, %v) = %q, want %q", c.v, c.before, c.base, got, c.want)
		}
	}
}

// TestRun_StoppedInTheBaselineKeepsItsFinishedCells: a run stopped in the
// baseline's raw W2 cell returns the limits and raw W1 cells measured
// before it, without the cell cut short, and no store's cell.
func TestRun_StoppedInTheBaselineKeepsItsFinishedCells(t *testing.T) {
	r := testservers.StartRedis(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rep, err := Run(ctx, Config{
		Stores: []string{r.URL()}, Clients: []int{1, 2}, ContendedClients: []int{2},
		Duration: 200 * time.Millisecond, SkipHold: true,
		RawRedisAddr: r.Addr(), LimitsDir: t.TempDir(),
		Progress: func(format string, a ...any) {
			if strings.HasPrefix(fmt.Sprintf(format, a...), "W2 raw Redis") {
				go func() { time.Sleep(50 * time.Millisecond); cancel() }()
			}
		},
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
	b := rep.Baseline
	if b == nil || b.Limits.FsyncP50Us <= 0 || len(b.RawRedis) != 2 || len(b.RawRedisContended) != 0 {
		t.Fatalf("baseline %+v: want the limits and both raw W1 cells, no raw W2 cell", b)
	}
	if len(rep.Uncontended) != 0 || len(rep.Contended) != 0 {
		t.Fatalf("store cells %+v %+v after a stop in the baseline", rep.Uncontended, rep.Contended)
	}
}
