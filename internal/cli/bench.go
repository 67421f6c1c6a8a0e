package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/dlock-dev/dlock/internal/bench"
)

func newBenchCmd(g *globals) *cobra.Command {
	var (
		stores   []string
		clients  []int
		cclients []int
		duration time.Duration
		holdKeys int
		skipHold bool
		pids     []string
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
      server's resident memory, read from /proc for the PID given by --pid

Every client opens its own connection, as separate processes would. Each W1
and W2 cell runs for --duration.

Bench cleans up what it creates. On Redis (redis://, rediss://) it works
under a throwaway key prefix (prefix=dlock-bench-RANDOM) and deletes every key under it when it
ends, fence counters included; the store's other keys are not touched (a
URL that gives prefix= itself is used as it is, and nothing is deleted). Other stores
keep what their lock protocol keeps after a release (dlockd, etcd, ZooKeeper
and PostgreSQL keep at most their fence counters; Redlock its per-node
counters): run bench against a scratch store there.`,
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
			for i, s := range stores {
				scoped, cleanup, err := benchScope(s)
				if err != nil {
					return exit(ExitUsage, "%w", err)
				}
				if pid, ok := pidMap[s]; ok {
					pidMap[scoped] = pid
				}
				stores[i] = scoped
				defer func() {
					if err := cleanup(); err != nil {
						fmt.Fprintf(g.stderr, "dlock: warning: bench could not delete its keys on %s: %v\n", s, err)
					}
				}()
			}
			rep, err := bench.Run(cmd.Context(), bench.Config{
				Stores: stores, Clients: clients, ContendedClients: cclients, Duration: duration,
				HoldKeys: holdKeys, SkipHold: skipHold, ServerPIDs: pidMap,
				Progress: func(format string, a ...any) { fmt.Fprintf(g.stderr, "bench: "+format+"\n", a...) },
			})
			if err != nil && strings.HasPrefix(err.Error(), "bench: client count") {
				return exit(ExitUsage, "%w", err)
			}
			if err != nil {
				return g.storeErr("bench", "", err)
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
	fl.DurationVar(&duration, "duration", 3*time.Second, "length of each W1 and W2 cell")
	fl.IntVar(&holdKeys, "hold-keys", 100_000, "W3: keys held at once")
	fl.BoolVar(&skipHold, "skip-hold", false, "skip W3")
	fl.StringArrayVar(&pids, "pid", nil, "URL=PID of a store's server process, for W3 memory")
	return cmd
}

// benchScope returns the store URL bench uses for store and a function that
// deletes what bench created there. On Redis it adds a throwaway key prefix
// (unless the URL has one) and deletes every key under it; elsewhere it
// returns store unchanged and a no-op.
func benchScope(store string) (string, func() error, error) {
	noop := func() error { return nil }
	u, err := url.Parse(store)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
		return store, noop, nil
	}
	q := u.Query()
	if q.Has("prefix") {
		return store, noop, nil // the user's keys: not ours to delete
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "dlock-bench-" + hex.EncodeToString(b[:])
	q.Set("prefix", prefix)
	scoped := *u
	scoped.RawQuery = q.Encode()
	// The cleanup client: go-redis's own URL, without the driver's options.
	q.Del("prefix")
	q.Del("hints")
	plain := *u
	plain.RawQuery = q.Encode()
	opts, err := redis.ParseURL(plain.String())
	if err != nil {
		return "", nil, fmt.Errorf("bench: %s: %w", u.Redacted(), err)
	}
	cleanup := func() error {
		c := redis.NewClient(opts)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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
	return scoped.String(), cleanup, nil
}

// globEscape escapes the glob characters of Redis's MATCH.
func globEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`).Replace(s)
}
