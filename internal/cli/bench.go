package cli

import (
	"fmt"
	"strings"
	"time"

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
and W2 cell runs for --duration.`,
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
