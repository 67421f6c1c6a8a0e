package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-dev/dlock/internal/bench"
	"github.com/dlock-dev/dlock/internal/pgcommon"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

func newBenchCmd(g *globals) *cobra.Command {
	var (
		stores     []string
		clients    []int
		cclients   []int
		duration   time.Duration
		holdKeys   int
		holdSettle time.Duration
		skipHold   bool
		pids       []string
		rawRedis   string
		rawEtcd    string
		rawZK      string
		limits     string
		paired     bool
	)
	cmd := &cobra.Command{
		Use:   "bench [--store URL]...",
		Short: "Run the same lock workloads against several stores, side by side",
		Long: `Bench runs three bounded workloads against each store, one store at a time,
and prints one table per workload (Markdown, or JSON with -o json):

  W1  uncontended acquire+release cycles/s and acquire latency p50/p99,
      each client on its own key (--clients, default 1,8,64)
  W2  contended handoffs/s on one key, the gap from a release to the next
      grant (p50/p99) and the longest wait (--contended, default 8,64)
  W3  time to hold --hold-keys keys at once (default 100000) and the store
      server's resident memory, read from /proc for the PID given by --pid,
      the moment the last key is held and again --hold-settle later (the
      keys still held: what the server keeps once its collector caught up)

Every client opens its own Locker, as separate processes would; dlockd's
Lockers share one connection per process (the driver's default: add
private_conn=1 to the URL for one connection per client). Each W1 and W2
cell runs for --duration.

Two baselines read the stores' figures as ratios (absolute figures on a
shared machine move between runs): --raw-redis HOST:PORT runs W1 and W2
with go-redis alone (SET NX PX, the compare-and-delete Lua release, W2's
waiters polling with no pause; its keys end with each cycle and expire in
30 s otherwise), and --limits-dir DIR measures a loopback round trip and
an appended 4 KiB write with fdatasync in DIR (a durable store's data
directory): W1 and W2 rows then carry "× raw Redis", and W2 rows of
durable stores "× disk limit", 1 / (fdatasync + round trip).

--raw-etcd HOST:PORT and --raw-zk HOST:PORT run W1 with etcd's and
ZooKeeper's official clients alone, the lightest correct lock round trip
each allows (etcd: one lease per client, a put-if-absent transaction with
the lease, then a delete conditioned on the create revision; ZooKeeper: one
session per client, an ephemeral node created then deleted at its version):
the etcd and zk W1 rows then carry "× raw recipe". Their keys live under
/dlock-bench-raw/ (etcd) and /dlock-bench-raw-* (zk) and are deleted, and
their etcd leases revoked, when each cell ends.

--paired-baselines runs those raw W1 cells again just before each store's
W1 cell at the same client count, and takes the row's ratios against them
(named beside each ratio) rather than against the baseline measured at the
start: a shared machine's speed drifts over the minutes of a run by more
than the differences the ratios are read for. It needs one of the --raw
flags; W1 then takes twice as long (three times on etcd and zk with
--raw-redis and their own raw flag).

Bench cleans up what it creates. Unless the URL names a namespace of its
own, it works in a throwaway one named dlock-bench-RANDOM and deletes it
whole when it ends, fence counters included; nothing else in the store is
touched:

  redis, rediss   key prefix (prefix=); every key under it is deleted
  redlock         key prefix (prefix=); every key under it is deleted on
                  every node
  etcd            key prefix (the URL path); its range is deleted
  zk              root node (the URL path); it and its subtree are deleted
  postgres, postgresql, pgadvisory
                  table (dlock_table=dlock_bench_RANDOM); it and its fence
                  sequence are dropped

A URL that gives its own prefix=, path or dlock_table= is used as it is, and
nothing is deleted there. Ctrl-C (or SIGTERM) stops the run: bench releases
what it holds, deletes its namespace and exits 130 (143). A run stopped so,
or by a store's error, still prints the cells it finished (with -o json, as
the "report" of its error object); the cell it was in is not reported.

dlockd keeps no key after a release, but every grant and release is an
entry of its Raft log, which bench cannot remove: the log grows by the
run's operations until dlockd's next snapshot compacts it (Raft keeps a
bounded tail of entries after a snapshot).`,
		Example: `  dlock bench --store redis://127.0.0.1:6379 --store dlockd://127.0.0.1:7450
  dlock bench --store redis://127.0.0.1:6379 --pid redis://127.0.0.1:6379=$(pidof redis-server) -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(stores) == 0 {
				stores = []string{g.store}
			}
			pidMap, err := bench.ParsePIDs(pids)
			if err != nil {
				return exit(ExitUsage, "%w", err)
			}
			if holdSettle < 0 {
				return exit(ExitUsage, "bench: --hold-settle %v: want 0 (one reading) or a positive duration", holdSettle)
			}
			if paired && rawRedis == "" && rawEtcd == "" && rawZK == "" {
				return exit(ExitUsage, "bench: --paired-baselines needs a raw baseline to run again: --raw-redis, --raw-etcd or --raw-zk")
			}
			if duration <= 0 {
				return exit(ExitUsage, "bench: --duration %v: want a positive duration (at least %v)", duration, bench.MinDuration)
			}
			cfg := bench.Config{
				Clients: clients, ContendedClients: cclients, Duration: duration,
				HoldKeys: holdKeys, HoldSettle: holdSettle, SkipHold: skipHold,
				RawRedisAddr: rawRedis, RawEtcdEndpoint: rawEtcd, RawZKAddr: rawZK, LimitsDir: limits,
				PairedBaselines: paired,
				Progress:        func(format string, a ...any) { fmt.Fprintf(g.stderr, "bench: "+format+"\n", a...) },
			}
			// Refused before any namespace is made, so that nothing is
			// left to delete (nor a warning that it could not be).
			if err := cfg.Check(); err != nil {
				return exit(ExitUsage, "%w", err)
			}
			asGiven := map[string]string{} // scoped URL → the URL given
			// touched: the stores the run called (Config.Touching, from
			// this goroutine); only their namespaces can hold anything.
			// runErr: the run's error, for the cleanups deferred below.
			touched := map[string]bool{}
			var runErr error
			for i, s := range stores {
				scoped, cleanup, err := benchScope(s)
				if err != nil {
					return exit(ExitUsage, "%w", err)
				}
				if pid, ok := pidMap[s]; ok {
					pidMap[scoped] = pid
				}
				stores[i] = scoped
				asGiven[scoped] = s
				defer func() {
					if !touched[scoped] {
						return // never called: nothing of the run's is there
					}
					if err := cleanup(); err != nil {
						var se *bench.StoreError
						if errors.As(runErr, &se) && se.Store == scoped && se.Probe {
							return // its first call failed (unreachable?): the run made nothing there
						}
						where := urlparam.RedactString(scoped)
						fmt.Fprintf(g.stderr, "dlock: warning: bench could not delete its namespace, delete it by hand: %s: %v\n", where, err)
					}
				}()
			}
			// Ctrl-C or SIGTERM stops the run; what it holds is released
			// and its namespace deleted (the deferred cleanups) before
			// bench exits 128+signal.
			ctx, stop := context.WithCancel(cmd.Context())
			defer stop()
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
			defer signal.Stop(sigs)
			var caught atomic.Value // the os.Signal that stopped the run
			watchDone := make(chan struct{})
			defer func() { stop(); <-watchDone }()
			go func() {
				defer close(watchDone)
				select {
				case sig := <-sigs:
					caught.Store(sig)
					fmt.Fprintf(g.stderr, "dlock: bench: %v: stopping, releasing and deleting what it created\n", sig)
					stop()
				case <-ctx.Done():
				}
			}()
			cfg.Stores, cfg.ServerPIDs = stores, pidMap
			cfg.Touching = func(store string) { touched[store] = true }
			rep, err := bench.Run(ctx, cfg)
			runErr = err
			// The report names each store as the user gave it (its password
			// masked), not by its throwaway namespace.
			given := func(s string) string {
				if g, ok := asGiven[s]; ok {
					return bench.Redact(g)
				}
				return bench.Redact(s)
			}
			for i := range rep.Uncontended {
				rep.Uncontended[i].Store = given(rep.Uncontended[i].Store)
			}
			for i := range rep.Contended {
				rep.Contended[i].Store = given(rep.Contended[i].Store)
			}
			for i := range rep.Held {
				rep.Held[i].Store = given(rep.Held[i].Store)
			}
			var fail error
			if sig, ok := caught.Load().(os.Signal); ok {
				code := 128 + int(sig.(syscall.Signal))
				fail = exit(code, "bench: interrupted by %v", sig)
			} else if err != nil {
				// The message names the store that failed, not the
				// global --store.
				gs := g
				var se *bench.StoreError
				if errors.As(err, &se) {
					c := *g
					c.store = se.Store
					if u, ok := asGiven[se.Store]; ok {
						c.store = u
					}
					gs = &c
				}
				fail = gs.storeErr("bench", "", err)
			}
			if fail != nil {
				// The cells finished before the failure or the signal
				// are kept: printed as tables, or as the error's
				// "report" with -o json.
				var ee *exitError
				if !rep.Empty() && errors.As(fail, &ee) {
					if g.json() {
						ee.report = rep
					} else {
						rep.Markdown(g.stdout)
						fmt.Fprintln(g.stderr, "dlock: bench: the run stopped early: the tables hold the cells it finished")
					}
				}
				return fail
			}
			if g.json() {
				g.printJSON(rep)
			} else {
				rep.Markdown(g.stdout)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&stores, "store", nil, "store URL to benchmark (repeat for several; default: the global --store)")
	fl.IntSliceVar(&clients, "clients", []int{1, 8, 64}, "W1 client counts")
	fl.IntSliceVar(&cclients, "contended", []int{8, 64}, "W2 client counts")
	fl.DurationVar(&duration, "duration", 3*time.Second, "length of each W1 and W2 cell (at least 100ms)")
	fl.IntVar(&holdKeys, "hold-keys", 100_000, "W3: keys held at once")
	fl.DurationVar(&holdSettle, "hold-settle", 15*time.Second, "W3: read the server's memory again this long after the last grant, the keys still held (0: once); needs --pid")
	fl.BoolVar(&skipHold, "skip-hold", false, "skip W3")
	fl.StringArrayVar(&pids, "pid", nil, "URL=PID of a store's server process, for W3 memory")
	fl.StringVar(&rawRedis, "raw-redis", "", "HOST:PORT of a Redis server: also run W1 and W2 with go-redis alone, the baseline of the ratios")
	fl.StringVar(&rawEtcd, "raw-etcd", "", "HOST:PORT of an etcd endpoint: also run W1 with the etcd client alone, the base of the etcd rows' \"× raw recipe\"")
	fl.StringVar(&rawZK, "raw-zk", "", "HOST:PORT of a ZooKeeper server: also run W1 with go-zookeeper alone, the base of the zk rows' \"× raw recipe\"")
	fl.BoolVar(&paired, "paired-baselines", false, "run the raw W1 cells (--raw-redis, --raw-etcd, --raw-zk) again just before each store's W1 cell and take its ratios against them")
	fl.StringVar(&limits, "limits-dir", "", "directory (a durable store's data dir): also measure a loopback round trip and fdatasync there")
	return cmd
}

// benchScope returns the store URL bench uses for store and a function that
// deletes what bench created there. When the URL does not name a namespace
// of its own, bench gets a throwaway one, named dlock-bench-RANDOM (or
// dlock_bench_RANDOM where only SQL names fit), which the cleanup deletes
// whole:
//
//   - redis, rediss, redlock: the key prefix (prefix=); the cleanup deletes
//     every key under it (on every node for redlock).
//   - etcd: the key prefix (the URL path); the cleanup deletes its range.
//   - zk: the root node (the URL path); the cleanup deletes it and its
//     subtree.
//   - postgres, postgresql, pgadvisory: the table (dlock_table=); the
//     cleanup drops it and its fence sequence.
//
// A URL that already names its namespace is the user's: it is used as it
// is, and the cleanup is a no-op; so is any other scheme (dlockd keeps no
// per-key state after a release; mem is the process's own).
func benchScope(store string) (string, func() error, error) {
	noop := func() error { return nil }
	u, err := url.Parse(store)
	if err != nil {
		return store, noop, nil // bench.Run reports the bad URL
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "dlock-bench-" + hex.EncodeToString(b[:])
	q := u.Query()
	scoped := *u
	switch u.Scheme {
	case "redis", "rediss":
		if q.Has("prefix") {
			return store, noop, nil // the user's keys: not ours to delete
		}
		q.Set("prefix", name)
		scoped.RawQuery = q.Encode()
		// The cleanup client: go-redis's own URL, without the driver's options.
		q.Del("prefix")
		q.Del("hints")
		plain := *u
		plain.RawQuery = q.Encode()
		opts, err := redis.ParseURL(plain.String())
		if err != nil {
			return "", nil, fmt.Errorf("bench: %s: %w", urlparam.Redact(u), err)
		}
		return scoped.String(), func() error { return deleteRedisKeys(opts, name) }, nil
	case "redlock":
		if q.Has("prefix") {
			return store, noop, nil
		}
		q.Set("prefix", name)
		scoped.RawQuery = q.Encode()
		db := 0
		if v := q.Get("db"); v != "" {
			if db, err = strconv.Atoi(v); err != nil {
				return store, noop, nil // the driver refuses the URL
			}
		}
		var user, pass string
		if u.User != nil {
			user = u.User.Username()
			pass, _ = u.User.Password()
		}
		cleanup := func() error {
			var errs []error
			for _, h := range strings.Split(u.Host, ",") {
				if h = strings.TrimSpace(h); h == "" {
					continue
				}
				if err := deleteRedisKeys(&redis.Options{Addr: h, Username: user, Password: pass, DB: db}, name); err != nil {
					errs = append(errs, fmt.Errorf("node %s: %w", h, err))
				}
			}
			return errors.Join(errs...)
		}
		return scoped.String(), cleanup, nil
	case "etcd":
		if strings.Trim(u.Path, "/") != "" {
			return store, noop, nil
		}
		scoped.Path = "/" + name
		scoped.RawPath = ""
		return scoped.String(), func() error { return deleteEtcdPrefix(u, "/"+name+"/") }, nil
	case "zk":
		if strings.Trim(u.Path, "/") != "" {
			return store, noop, nil
		}
		scoped.Path = "/" + name
		scoped.RawPath = ""
		return scoped.String(), func() error { return deleteZKTree(u.Host, "/"+name) }, nil
	case "postgres", "postgresql", "pgadvisory":
		if q.Has("dlock_table") {
			return store, noop, nil
		}
		table := strings.ReplaceAll(name, "-", "_")
		schema := q.Get("dlock_schema")
		if schema == "" {
			schema = "public"
		}
		q.Set("dlock_table", table)
		scoped.RawQuery = q.Encode()
		pu := *u
		if pu.Scheme == "pgadvisory" {
			pu.Scheme = "postgres"
		}
		// The cleanup connection: pgx's own URL, without the drivers' and
		// the pool's options.
		drop := []string{"dlock_schema", "dlock_table"}
		for k := range q {
			if strings.HasPrefix(k, "pool_") {
				drop = append(drop, k)
			}
		}
		plain, _ := pgcommon.TakeParams(&pu, drop...)
		return scoped.String(), func() error { return dropPGTable(plain, schema, table) }, nil
	}
	return store, noop, nil
}

// cleanupTimeout bounds each store's cleanup.
const cleanupTimeout = 2 * time.Minute

// deleteRedisKeys deletes every key under "prefix:" on the server opts
// names.
func deleteRedisKeys(opts *redis.Options, prefix string) error {
	c := redis.NewClient(opts)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	iter := c.Scan(ctx, 0, globEscape(prefix)+":*", 1000).Iterator()
	batch := make([]string, 0, 1000)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := c.Unlink(ctx, batch...).Err()
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	return flush()
}

// deleteEtcdPrefix deletes every key under prefix on the etcd cluster u
// names.
func deleteEtcdPrefix(u *url.URL, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	cfg := clientv3.Config{Endpoints: strings.Split(u.Host, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop(), Context: ctx}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Delete(ctx, prefix, clientv3.WithPrefix())
	return err
}

// deleteZKTree deletes root and every node under it on the ZooKeeper
// ensemble host names. Nodes that vanish meanwhile (ephemeral nodes of
// closed sessions, emptied containers) are not errors.
func deleteZKTree(host, root string) error {
	conn, _, err := zk.Connect(strings.Split(host, ","), 4*time.Second, zk.WithLogInfo(false), zk.WithLogger(zkQuiet{}))
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline := time.Now().Add(cleanupTimeout)
	var del func(p string) error
	del = func(p string) error {
		for {
			children, _, err := conn.Children(p)
			if errors.Is(err, zk.ErrNoNode) {
				return nil
			}
			if err != nil {
				return err
			}
			for _, ch := range children {
				if err := del(p + "/" + ch); err != nil {
					return err
				}
			}
			err = conn.Delete(p, -1)
			switch {
			case err == nil, errors.Is(err, zk.ErrNoNode):
				return nil
			case errors.Is(err, zk.ErrNotEmpty) && time.Now().Before(deadline):
				continue // a child appeared meanwhile
			default:
				return err
			}
		}
	}
	return del(root)
}

// zkQuiet drops go-zookeeper's log lines.
type zkQuiet struct{}

func (zkQuiet) Printf(string, ...any) {}

// dropPGTable drops the table schema.table and its fence sequence on the
// PostgreSQL server pgURL names.
func dropPGTable(pgURL, schema, table string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	c, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, "DROP TABLE IF EXISTS "+pgcommon.Ident(schema, table)+"; DROP SEQUENCE IF EXISTS "+pgcommon.Ident(schema, table+"_fence_seq"))
	return err
}

// globEscape escapes the glob characters of Redis's MATCH.
func globEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`).Replace(s)
}
