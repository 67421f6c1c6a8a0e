package main_test

// Issue 13 item 11: `dlock bench` leaves nothing behind, on every store it
// can target. Each test runs a short bench against a real store holding
// some of the user's data, then checks the store holds exactly what it held
// before.

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-dev/dlock/internal/testservers"
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
		c := redis.NewClient(&redis.Options{Addr: r.Addr()})
		defer c.Close()
		if err := c.Set(ctx, "user:data", "keep", 0).Err(); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	shortBench(t, "redlock://"+strings.Join(hosts, ","))
	for i, c := range clients {
		keys, err := c.Keys(ctx, "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(keys, []string{"user:data"}) {
			if len(keys) > 10 {
				keys = keys[:10]
			}
			t.Errorf("node %d: bench left %d keys behind (first: %q)", i, c.DBSize(ctx).Val()-1, keys)
		}
	}
}

func TestBenchCleanup_Etcd(t *testing.T) {
	e := testservers.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
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
