package main_test

// Issue 13 item 11: `dlock bench` leaves nothing behind, on every store it
// can target. Each test runs a short bench against a real store holding
// some of the user's data, then checks the store holds exactly what it held
// before.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-dev/dlock/internal/bench"
	"github.com/dlock-dev/dlock/internal/testservers"
	"github.com/dlock-dev/dlock/server/servertest"
)

// shortBench runs every workload briefly against store (W3 with a few
// hundred keys) and wants exit 0.
func shortBench(t *testing.T, store string) {
	t.Helper()
	res := dlock(t, store, "bench", "--store", store, "--clients", "2", "--contended", "2",
		"--duration", "200ms", "--hold-keys", "200", "-o", "json")
	wantCode(t, res, 0)
	if strings.Contains(res.stderr, "could not delete") {
		t.Fatalf("bench warned: %s", res.stderr)
	}
	// The report names the store as given, not by its throwaway namespace.
	var rep map[string][]struct {
		Store string `json:"store"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
		t.Fatalf("bench -o json: %v\n%s", err, res.stdout)
	}
	n := 0
	for table, rows := range rep {
		for _, r := range rows {
			n++
			if r.Store != store {
				t.Errorf("bench report %s names store %q, want %q", table, r.Store, store)
			}
		}
	}
	if n == 0 {
		t.Fatalf("bench report has no rows: %s", res.stdout)
	}
}

func TestBenchCleanup_Redlock(t *testing.T) {
	rs := testservers.StartRedisN(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var hosts []string
	var clients []*redis.Client
	for _, r := range rs {
		hosts = append(hosts, r.Addr())
		clients = append(clients, redisWithUserData(t, ctx, r))
	}
	shortBench(t, "redlock://"+strings.Join(hosts, ","))
	for i, c := range clients {
		wantOnlyUserData(t, ctx, c, fmt.Sprintf("node %d: bench", i))
	}
}

// redisWithUserData returns a client of r holding one key of the user's,
// user:data, which a bench must leave alone.
func redisWithUserData(t *testing.T, ctx context.Context, r *testservers.Redis) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Set(ctx, "user:data", "keep", 0).Err(); err != nil {
		t.Fatal(err)
	}
	return c
}

// wantOnlyUserData fails the test when c's database holds anything but
// user:data: what names what left it behind.
func wantOnlyUserData(t *testing.T, ctx context.Context, c *redis.Client, what string) {
	t.Helper()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys, []string{"user:data"}) {
		if len(keys) > 10 {
			keys = keys[:10]
		}
		t.Errorf("%s left %d keys behind (first: %q)", what, c.DBSize(ctx).Val()-1, keys)
	}
}

func TestBenchCleanup_Etcd(t *testing.T) {
	e := testservers.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := etcdClient(t, e)
	if _, err := c.Put(ctx, "/user/data", "keep"); err != nil {
		t.Fatal(err)
	}
	shortBench(t, e.URL())
	resp, err := c.Get(ctx, "", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	if !slices.Equal(keys, []string{"/user/data"}) {
		if len(keys) > 10 {
			keys = keys[:10]
		}
		t.Fatalf("bench left %d keys behind (first: %q)", resp.Count-1, keys)
	}
	// The bench's leases are gone too.
	leases, err := c.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 0 {
		t.Errorf("bench left %d etcd leases behind", len(leases.Leases))
	}
}

func TestBenchCleanup_ZooKeeper(t *testing.T) {
	z := testservers.StartZooKeeper(t)
	conn, _, err := zk.Connect([]string{z.Addr()}, 4*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Create("/userdata", []byte("keep"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	before, _, err := conn.Children("/")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(before)
	shortBench(t, "zk://"+z.Addr())
	after, _, err := conn.Children("/")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(after)
	if !slices.Equal(before, after) {
		t.Fatalf("root's children: %q before bench, %q after", before, after)
	}
}

func TestBenchCleanup_Postgres(t *testing.T) {
	p := testservers.StartPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "CREATE TABLE user_data (x int)"); err != nil {
		t.Fatal(err)
	}
	relations := func() []string {
		t.Helper()
		rows, err := c.Query(ctx, `SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	before := relations()
	for _, scheme := range []string{"postgres", "pgadvisory"} {
		shortBench(t, scheme+strings.TrimPrefix(p.URL(), "postgres"))
		if after := relations(); !slices.Equal(before, after) {
			t.Fatalf("%s: relations %q before bench, %q after", scheme, before, after)
		}
	}
}

// interruptedBench starts a bench on store whose workload (W1, W2 or W3)
// would run long (a W1 cell of 60s; W1 then a W2 cell of 10s each; W3
// holding a million keys), sends SIGINT half a second into it, and wants
// exit 130 within 5s of the signal. It returns the -o json error object
// printed on stdout.
func interruptedBench(t *testing.T, store, workload string, extra ...string) interruptedJSON {
	t.Helper()
	duration := map[string]string{"W1": "60s", "W2": "10s", "W3": "200ms", "W1 raw Redis": "60s"}[workload]
	cmd := command(store, append([]string{"bench", "--store", store, "--clients", "4", "--contended", "4",
		"--duration", duration, "--hold-keys", "1000000", "-o", "json"}, extra...)...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The reader collects stderr, sends the signal and waits for the exit.
	var (
		errText strings.Builder
		sent    time.Time
	)
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			errText.WriteString(sc.Text() + "\n")
			if strings.HasPrefix(sc.Text(), "bench: "+workload+" ") {
				time.Sleep(500 * time.Millisecond)
				sent = time.Now()
				if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
					errText.WriteString("signal: " + err.Error() + "\n")
				}
			}
		}
		done <- cmd.Wait()
	}()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 || sent.IsZero() {
			t.Fatalf("bench interrupted in %s: %v, want exit 130 after SIGINT\nstderr: %s", workload, err, errText.String())
		}
		if took := time.Since(sent); took > 5*time.Second {
			t.Errorf("bench interrupted in %s exited %v after SIGINT", workload, took)
		}
		if !strings.Contains(errText.String(), "stopping, releasing and deleting") || strings.Contains(errText.String(), "could not delete") {
			t.Fatalf("bench interrupted in %s: stderr: %s", workload, errText.String())
		}
	case <-time.After(50 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("bench still running 50s after start\nstderr: %s", errText.String())
	}
	var out interruptedJSON
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("bench interrupted in %s: stdout is not one JSON object: %v\n%s", workload, err, stdout.String())
	}
	if out.Code != "interrupted" || out.ExitCode != 130 {
		t.Fatalf("bench interrupted in %s: stdout %s, want code interrupted, exit_code 130", workload, stdout.String())
	}
	return out
}

// interruptedJSON is the -o json error of an interrupted bench: the cells
// it finished are its report.
type interruptedJSON struct {
	Code     string        `json:"code"`
	ExitCode int           `json:"exit_code"`
	Report   *bench.Report `json:"report"`
}

// TestBenchCleanup_InterruptedRedis: a bench stopped by Ctrl-C in the
// middle of W3 (thousands of keys held, with a 10-minute TTL) still
// releases them and deletes its namespace.
func TestBenchCleanup_InterruptedRedis(t *testing.T) {
	r := testservers.StartRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := redisWithUserData(t, ctx, r)
	out := interruptedBench(t, r.URL(), "W3")
	wantOnlyUserData(t, ctx, c, "interrupted bench")
	// The W1 and W2 cells finished before the signal are kept, under the
	// URL given; the W3 cell cut short is not reported.
	rep := out.Report
	if rep == nil || len(rep.Uncontended) != 1 || len(rep.Contended) != 1 || len(rep.Held) != 0 {
		t.Fatalf("bench interrupted in W3: report %+v, want the W1 and W2 cells and no W3", rep)
	}
	w1, w2 := rep.Uncontended[0], rep.Contended[0]
	if w1.Store != r.URL() || w1.Clients != 4 || w1.CyclesPerSec <= 0 || w2.Store != r.URL() || w2.Clients != 4 || w2.HandoffsPerSec <= 0 {
		t.Fatalf("bench interrupted in W3: W1 %+v, W2 %+v: want 4 clients on %s, each with figures", w1, w2, r.URL())
	}
}

// TestBenchCleanup_InterruptedRawRedis: a bench stopped by Ctrl-C in a raw
// Redis cell (--raw-redis) leaves none of the raw loop's keys behind: the
// release in flight when the signal came used the cancelled context, and
// its key stayed for its 30 s TTL.
func TestBenchCleanup_InterruptedRawRedis(t *testing.T) {
	r := testservers.StartRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := redisWithUserData(t, ctx, r)
	out := interruptedBench(t, r.URL(), "W1 raw Redis", "--raw-redis", r.Addr(), "--paired-baselines")
	wantOnlyUserData(t, ctx, c, "bench interrupted in a raw Redis cell")
	if out.Report != nil {
		t.Fatalf("bench interrupted in its first cell reported %+v, want no report", out.Report)
	}
}

// TestBenchCleanup_InterruptedEtcd: on etcd, a bench interrupted in any
// workload gives its leases back too (they are not left to run out their
// TTL), and deletes its keys.
func TestBenchCleanup_InterruptedEtcd(t *testing.T) {
	e := testservers.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := etcdClient(t, e)
	seen := map[clientv3.LeaseID]bool{} // leases left by an interrupted W2
	for _, w := range []string{"W1", "W2", "W3"} {
		interruptedBench(t, e.URL(), w)
		resp, err := c.Get(ctx, "", clientv3.WithFromKey(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count != 0 {
			t.Errorf("bench interrupted in %s left %d keys behind", w, resp.Count)
		}
		// A waiting acquisition cut off by the interrupt can leave a lease
		// the client never learnt the id of (etcddriver grants it under
		// the caller's context: the server granted it, the cancelled call
		// returned ctx's error): it holds no key and runs out with the
		// bench's 30s TTL. Anything else is a leak.
		leases, err := c.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range leases.Leases {
			ttl, err := c.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
			if err != nil {
				t.Fatal(err)
			}
			if ttl.TTL == -1 { // expired meanwhile
				continue
			}
			if len(ttl.Keys) != 0 || ttl.GrantedTTL > 30 || w != "W2" && !seen[l.ID] {
				t.Errorf("bench interrupted in %s left etcd lease %x behind (TTL %ds, keys %q)", w, l.ID, ttl.GrantedTTL, ttl.Keys)
			}
			t.Logf("bench interrupted in %s: a key-less etcd lease of %ds remains until it expires", w, ttl.GrantedTTL)
			seen[l.ID] = true
		}
	}
}

// etcdClient returns a client of e, closed when the test ends.
func etcdClient(t *testing.T, e *testservers.Etcd) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestBench_Baselines: --raw-redis and --limits-dir add the baseline to the
// report (raw Redis W1 and W2, a loopback round trip and fdatasync),
// --paired-baselines a raw Redis cell before each W1 row, and the raw loops
// leave nothing behind in the user's Redis either.
func TestBench_Baselines(t *testing.T) {
	r := testservers.StartRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := redisWithUserData(t, ctx, r)
	res := dlock(t, r.URL(), "bench", "--store", r.URL(), "--clients", "2", "--contended", "2",
		"--duration", "200ms", "--skip-hold", "--raw-redis", r.Addr(), "--limits-dir", t.TempDir(), "--paired-baselines", "-o", "json")
	wantCode(t, res, 0)
	var rep struct {
		Uncontended []struct {
			RawRedisBefore float64 `json:"raw_redis_before_cycles_per_sec"`
		} `json:"uncontended"`
		Baseline struct {
			RawRedis []struct {
				CyclesPerSec float64 `json:"cycles_per_sec"`
			} `json:"raw_redis"`
			RawRedisContended []struct {
				HandoffsPerSec float64 `json:"handoffs_per_sec"`
			} `json:"raw_redis_contended"`
			Limits struct {
				RTT   float64 `json:"loopback_rtt_p50_us"`
				Fsync float64 `json:"fsync_p50_us"`
			} `json:"limits"`
		} `json:"baseline"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
		t.Fatalf("bench -o json: %v\n%s", err, res.stdout)
	}
	b := rep.Baseline
	if len(b.RawRedis) != 1 || b.RawRedis[0].CyclesPerSec <= 0 || len(b.RawRedisContended) != 1 || b.RawRedisContended[0].HandoffsPerSec <= 0 || b.Limits.RTT <= 0 || b.Limits.Fsync <= 0 {
		t.Fatalf("baseline %+v\n%s", b, res.stdout)
	}
	if len(rep.Uncontended) != 1 || rep.Uncontended[0].RawRedisBefore <= 0 {
		t.Fatalf("--paired-baselines: W1 rows %+v, want one with the raw Redis cell run before it\n%s", rep.Uncontended, res.stdout)
	}
	wantOnlyUserData(t, ctx, c, "bench --raw-redis")
	// Nothing to pair without a raw baseline: a usage error, not a run
	// that silently ignores the flag.
	res = dlock(t, r.URL(), "bench", "--store", r.URL(), "--skip-hold", "--paired-baselines")
	wantCode(t, res, 64)
	if !strings.Contains(res.stderr, "--paired-baselines") || !strings.Contains(res.stderr, "--raw-redis") {
		t.Fatalf("bench --paired-baselines without a raw baseline said %q, want it to name the flags", res.stderr)
	}
}

// TestBench_HoldSettle: with --pid, W3 reads the server's memory when the
// last key is held and again --hold-settle later, the keys still held; a
// negative --hold-settle is a usage error.
func TestBench_HoldSettle(t *testing.T) {
	r := testservers.StartRedis(t)
	res := dlock(t, r.URL(), "bench", "--store", r.URL(), "--clients", "1", "--contended", "2", "--duration", "100ms",
		"--hold-keys", "300", "--hold-settle", "300ms", "--pid", fmt.Sprintf("%s=%d", r.URL(), r.PID()), "-o", "json")
	wantCode(t, res, 0)
	var rep struct {
		Held []struct {
			Keys       int     `json:"keys"`
			Held       float64 `json:"server_rss_mib"`
			Settled    float64 `json:"server_settled_mib"`
			SettledRSS float64 `json:"server_settled_rss_mib"`
		} `json:"held"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
		t.Fatalf("bench -o json: %v\n%s", err, res.stdout)
	}
	if len(rep.Held) != 1 || rep.Held[0].Keys != 300 || rep.Held[0].Held <= 0 || rep.Held[0].Settled <= 0 || rep.Held[0].SettledRSS < rep.Held[0].Settled {
		t.Fatalf("W3 rows %+v, want one of 300 keys with its memory held and settled (RSS ≥ PSS)\n%s", rep.Held, res.stdout)
	}
	res = dlock(t, r.URL(), "bench", "--store", r.URL(), "--hold-settle", "-1s")
	wantCode(t, res, 64)
	if !strings.Contains(res.stderr, "--hold-settle") {
		t.Fatalf("bench --hold-settle -1s said %q, want it to name the flag", res.stderr)
	}
}

// TestBench_RawRecipes: --raw-etcd and --raw-zk add W1 with each store's
// official client alone to the report, and the etcd and zk W1 rows carry
// their ratio to it ("× raw recipe").
func TestBench_RawRecipes(t *testing.T) {
	e := testservers.StartEtcd(t)
	z := testservers.StartZooKeeper(t)
	res := dlock(t, e.URL(), "bench", "--store", e.URL(), "--store", z.URL(), "--clients", "2", "--contended", "2",
		"--duration", "200ms", "--skip-hold", "--raw-etcd", e.Addr(), "--raw-zk", z.Addr(), "-o", "json")
	wantCode(t, res, 0)
	var rep struct {
		Baseline struct {
			RawEtcd []struct {
				CyclesPerSec float64 `json:"cycles_per_sec"`
			} `json:"raw_etcd"`
			RawZK []struct {
				CyclesPerSec float64 `json:"cycles_per_sec"`
			} `json:"raw_zk"`
		} `json:"baseline"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
		t.Fatalf("bench -o json: %v\n%s", err, res.stdout)
	}
	b := rep.Baseline
	if len(b.RawEtcd) != 1 || b.RawEtcd[0].CyclesPerSec <= 0 || len(b.RawZK) != 1 || b.RawZK[0].CyclesPerSec <= 0 {
		t.Fatalf("baseline %+v\n%s", b, res.stdout)
	}
	md := dlock(t, e.URL(), "bench", "--store", e.URL(), "--clients", "1", "--contended", "2",
		"--duration", "200ms", "--skip-hold", "--raw-etcd", e.Addr())
	wantCode(t, md, 0)
	if !strings.Contains(md.stdout, "× raw recipe") || !strings.Contains(md.stdout, "| raw-etcd W1 | 1 |") {
		t.Errorf("bench Markdown lacks the raw etcd recipe:\n%s", md.stdout)
	}
}

// TestBench_UnreachableStoreFailsNamingIt: a store that cannot be reached
// ends bench with exit 69 and a message that names that store's address,
// not DLOCK_STORE's: a dlockd URL (its driver dials lazily) used to give a
// table of zeros and exit 0, and a Redis URL a message about the global
// store (found by a helper's break test). Nor does it warn that it could
// not delete a namespace there: it made none.
func TestBench_UnreachableStoreFailsNamingIt(t *testing.T) {
	global := "dlockd://" + servertest.FreePort(t)
	for _, store := range []string{"dlockd://" + servertest.FreePort(t), "redis://" + servertest.FreePort(t)} {
		res := dlock(t, global, "bench", "--store", store, "--clients", "1", "--contended", "2", "--duration", "300ms", "--skip-hold")
		wantCode(t, res, 69)
		host := strings.TrimPrefix(strings.TrimPrefix(store, "dlockd://"), "redis://")
		if !strings.Contains(res.stderr, "cannot reach the store at "+host) || strings.Contains(res.stderr, strings.TrimPrefix(global, "dlockd://")) {
			t.Errorf("bench --store %s (DLOCK_STORE %s): stderr %q, want it to name %s only", store, global, res.stderr, host)
		}
		if strings.Contains(res.stdout, "| 0 |") {
			t.Errorf("bench --store %s printed a table: %s", store, res.stdout)
		}
		if strings.Contains(res.stderr, "could not delete") {
			t.Errorf("bench --store %s warned of a namespace it never made: %q", store, res.stderr)
		}
	}
}

// TestBench_UsageErrorsTouchNoStore: client counts and cell durations bench
// would refuse are refused before it calls any store (exit 64, no
// namespace made, no warning that one could not be deleted), whether or
// not the store is reachable; a duration too short to make one cycle used
// to print a table of zeros.
func TestBench_UsageErrorsTouchNoStore(t *testing.T) {
	store := "redis://" + servertest.FreePort(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--duration", "1ns"}, "shorter than 100ms"},
		{[]string{"--duration", "0s"}, "want a positive duration"},
		{[]string{"--duration", "-1s"}, "want a positive duration"},
		{[]string{"--clients", "2,2"}, "client count 2 is given twice"},
		{[]string{"--contended", "0"}, "client count 0 is outside"},
	} {
		res := dlock(t, store, append([]string{"bench", "--store", store, "--skip-hold"}, c.args...)...)
		wantCode(t, res, 64)
		if !strings.Contains(res.stderr, c.want) || strings.Contains(res.stderr, "could not delete") || strings.Contains(res.stderr, "cannot reach") {
			t.Errorf("bench %v: stderr %q, want only %q", c.args, res.stderr, c.want)
		}
	}
}

// TestBench_FailedStoreKeepsFinishedCells: a run whose second store cannot
// be reached still prints the first store's tables, then the second's
// error, and exits as for an unreachable store (69).
func TestBench_FailedStoreKeepsFinishedCells(t *testing.T) {
	r := testservers.StartRedis(t)
	dead := "redis://" + servertest.FreePort(t)
	res := dlock(t, r.URL(), "bench", "--store", r.URL(), "--store", dead, "--clients", "2", "--contended", "2",
		"--duration", "200ms", "--skip-hold")
	wantCode(t, res, 69)
	for _, want := range []string{"### W1", "| redis | 2 |", "### W2"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, res.stdout)
		}
	}
	if strings.Contains(res.stdout, strings.TrimPrefix(dead, "redis://")) {
		t.Errorf("stdout has a row of the unreachable store:\n%s", res.stdout)
	}
	if !strings.Contains(res.stderr, "stopped early") || !strings.Contains(res.stderr, strings.TrimPrefix(dead, "redis://")) {
		t.Errorf("stderr %q: want the unreachable store's address and that the run stopped early", res.stderr)
	}
}
