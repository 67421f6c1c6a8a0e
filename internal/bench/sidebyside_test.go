package bench

// BenchmarkSideBySide starts one real server of every store dlock has (each
// on a free loopback port, with its data in a temp dir, stopped by PID) and
// runs the dlock bench workloads against all of them in one run. It is the
// run behind docs/BENCHMARKS.md. Beside the stores it measures the
// machine (a loopback round trip, fdatasync in dlockd's data directory)
// raw Redis with go-redis alone, and the raw etcd and ZooKeeper lock
// recipes with their official clients alone (Baseline), so that each store's
// figures come with their ratios to those of the same run:
//
// Each W1 row's ratios are against the raw cells run just before it
// (BENCH_PAIRED=0: against the baseline at the start of the run only).
//
//	make bench-stores                      # writes docs/BENCHMARKS-run.md
//	BENCH_DURATION=5s BENCH_HOLD_KEYS=100000 BENCH_HOLD_SETTLE=15s BENCH_OUT=/tmp/run.md \
//	  go test -run '^$' -bench SideBySide -benchtime 1x -timeout 60m ./internal/bench

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/dlock-dev/dlock/drivers/azblobdriver"
	_ "github.com/dlock-dev/dlock/drivers/consuldriver"
	_ "github.com/dlock-dev/dlock/drivers/dlockddriver"
	_ "github.com/dlock-dev/dlock/drivers/dynamodbdriver"
	_ "github.com/dlock-dev/dlock/drivers/etcddriver"
	_ "github.com/dlock-dev/dlock/drivers/gcsdriver"
	_ "github.com/dlock-dev/dlock/drivers/pgadvisory"
	_ "github.com/dlock-dev/dlock/drivers/pgdriver"
	_ "github.com/dlock-dev/dlock/drivers/redisdriver"
	_ "github.com/dlock-dev/dlock/drivers/redlockdriver"
	_ "github.com/dlock-dev/dlock/drivers/zkdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/internal/testservers/gcsfake"
	"github.com/dlock-dev/dlock/server/servertest"
)

func BenchmarkSideBySide(b *testing.B) {
	defer servertest.Cleanup()
	dur := 3 * time.Second
	if v := os.Getenv("BENCH_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("BENCH_DURATION: %v", err)
		}
		dur = d
	}
	holdKeys := 100_000
	if v := os.Getenv("BENCH_HOLD_KEYS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatalf("BENCH_HOLD_KEYS: %v", err)
		}
		holdKeys = n
	}
	// W3 reads each server's memory again this long after the last grant,
	// the keys still held (the "settled" column).
	settle := 15 * time.Second
	if v := os.Getenv("BENCH_HOLD_SETTLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("BENCH_HOLD_SETTLE: %v", err)
		}
		settle = d
	}
	// Each W1 row's ratios are against raw cells run just before it
	// (Config.PairedBaselines) unless BENCH_PAIRED=0.
	paired := os.Getenv("BENCH_PAIRED") != "0"
	only := os.Getenv("BENCH_STORES") // e.g. "dlockd,redis"; empty: all
	want := func(name string) bool {
		return only == "" || strings.Contains(","+only+",", ","+name+",")
	}

	var stores []string
	pids := map[string]int{}
	// The machine's limits are measured where dlockd writes (else in the
	// temp dir), and raw Redis beside the dlock Redis driver, in the same
	// run: the ratios are the figures to read.
	limitsDir := os.TempDir()
	var rawRedis, rawEtcd, rawZK string
	if want("dlockd") {
		d := servertest.StartProcess(b)
		// Twice: the Drivers of one process share connections (the
		// default), and each client on a connection of its own, as
		// clients in separate processes are (W3 runs once).
		u := "dlockd://" + d.Addr()
		stores, pids[u] = append(stores, u, u+"?private_conn=1"), d.PID()
		limitsDir = d.DataDir
	}
	if want("redis") {
		r := testservers.StartRedis(b)
		stores, pids[r.URL()] = append(stores, r.URL()), r.PID()
		rawRedis = r.Addr()
	}
	if want("redlock") {
		rs := testservers.StartRedisN(b, 3)
		addrs := make([]string, len(rs))
		for i, r := range rs {
			addrs[i] = r.Addr()
		}
		stores = append(stores, "redlock://"+strings.Join(addrs, ","))
	}
	if want("etcd") {
		e := testservers.StartEtcd(b)
		stores, pids[e.URL()] = append(stores, e.URL()), e.PID()
		rawEtcd = e.Addr()
	}
	if want("zk") {
		z := testservers.StartZooKeeper(b)
		stores, pids[z.URL()] = append(stores, z.URL()), z.PID()
		rawZK = z.Addr()
	}
	if want("postgres") || want("pgadvisory") {
		pg := testservers.StartPostgres(b)
		if want("postgres") {
			stores, pids[pg.URL()] = append(stores, pg.URL()), pg.PID()
		}
		if want("pgadvisory") {
			u := strings.Replace(pg.URL(), "postgres://", "pgadvisory://", 1)
			stores, pids[u] = append(stores, u), pg.PID()
		}
	}
	if want("azblob") {
		// Azurite, the emulator: its figures say nothing about Azure's latency.
		az := testservers.StartAzurite(b)
		u := az.URL("bench")
		stores, pids[u] = append(stores, u), az.PID()
	}
	if want("consul") {
		// Consul v1.16.0, one server agent (Raft on /dev/shm, as in the tests).
		c := testservers.StartConsul(b)
		stores, pids[c.URL()] = append(stores, c.URL()), c.PID()
	}
	if want("dynamodb") {
		// dynalite, the emulator: its figures say nothing about DynamoDB's latency.
		dl := testservers.StartDynalite(b)
		testservers.UseDynaliteEnv(b)
		u := dl.URL("dlock_bench") + "&create_table=true"
		stores, pids[u] = append(stores, u), dl.PID()
	}
	if want("gcs") {
		// fake-gcs-server, the emulator, in this process (no server PID):
		// its figures say nothing about Cloud Storage's latency.
		g := gcsfake.Start(b, "dlock-bench")
		stores = append(stores, g.URL("dlock-bench", "bench"))
	}
	for range b.N {
		rep, err := Run(b.Context(), Config{
			Stores: stores, Duration: dur, HoldKeys: holdKeys, HoldSettle: settle, ServerPIDs: pids,
			RawRedisAddr: rawRedis, RawEtcdEndpoint: rawEtcd, RawZKAddr: rawZK, LimitsDir: limitsDir,
			PairedBaselines: paired,
			Progress:        func(format string, args ...any) { b.Logf(format, args...) },
		})
		if err != nil {
			b.Fatal(err)
		}
		var buf bytes.Buffer
		rep.Markdown(&buf)
		b.Log("\n" + buf.String())
		if out := os.Getenv("BENCH_OUT"); out != "" {
			if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
}
