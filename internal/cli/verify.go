package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/verify"
	"github.com/dlock-dev/dlock/verify/matrix"
)

func faultHelp() string {
	var b strings.Builder
	for _, f := range verify.Faults() {
		fmt.Fprintf(&b, "  %-17s %s\n", f.Name, f.Doc)
	}
	return b.String()
}

func storeNames() string { return strings.Join(matrix.StoreNames(), ", ") }

func newVerifyCmd(g *globals) *cobra.Command {
	var (
		faults        string
		duration, ttl time.Duration
		clients, keys int
		seed          uint64
		jsonOut, html string
	)
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Measure what a store guarantees under a fault: double grants, fence violations, stale writes",
		Long: `Verify runs clients that acquire, renew, work and release against the store
while a fault is injected and healed in cycles, each client writing its
fence to a fenced register (SQLite, guarded by fencesql) while it believes
it holds the key, and checks the history: double grants (and the store's own
early grants), fence regressions, stale writes the register accepted,
linearizability (porcupine), and how long the store was unavailable.

--store is a store URL (the clients reach each of its hosts through TCP
proxies this command owns, so the link faults work on any store; the
process faults need a store the verifier started), or the name of a store
the verifier starts on loopback and stops when done: ` + storeNames() + `.

Faults (comma-separated to combine; "none" for a baseline):
` + faultHelp() + `
The stores the verifier starts need the source tree (dlockd is built with
go build): run from a checkout of dlock.

Exit status: 0 when no safety checker failed, 1 when one did (the findings
say which; a store documented to fail that fault fails it too: see
dlock verify matrix), 64 for bad flags (checked before any store starts),
69 when the store cannot be reached or granted nothing in the whole run,
78 when the store cannot take the fault, 130 when interrupted (nothing
judged). dlock verify matrix runs every store × fault and writes
docs/GUARANTEES.md.`,
		Example: `  dlock verify --store redis://127.0.0.1:6379 --fault blackhole
  dlock verify --store dlockd3 --fault partition,leader-pause --duration 30s
  dlock verify --store redis-failover --fault failover --json failover.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			logf := func(format string, args ...any) {
				if g.debug {
					fmt.Fprintf(g.stderr, format+"\n", args...)
				}
			}
			defer matrix.Cleanup()
			cfg := verify.Config{Faults: faults, Duration: duration, Clients: clients, Keys: keys, TTL: ttl, Seed: seed, Logf: logf}
			if err := cfg.Check(); err != nil { // the flags as given
				return exit(ExitUsage, "%v", err)
			}
			ttl, duration = cfg.TTL, cfg.Duration
			if !strings.Contains(g.store, "://") {
				ttl, duration = matrix.RunTTL(g.store, ttl, duration)
				cfg.TTL, cfg.Duration = ttl, duration
			}
			for _, p := range []string{jsonOut, html} {
				if err := checkWritable(p); err != nil {
					return exit(ExitUsage, "verify: %v", err)
				}
			}
			var target verify.Target
			if strings.Contains(g.store, "://") {
				t, err := verify.NewURLTarget(g.store, seed)
				if err != nil {
					return exit(ExitUsage, "%v", err)
				}
				target = t
			} else {
				if !matrix.Has(g.store) {
					return exit(ExitUsage, "verify: --store %q is neither a store URL (scheme://host:port) nor a store the verifier starts (%s)", g.store, storeNames())
				}
				if asked, _ := cmd.Flags().GetDuration("ttl"); asked != 0 && asked < ttl {
					fmt.Fprintf(g.stderr, "verify: %s takes TTLs of at least %v: TTL %v, run %v\n", g.store, ttl, ttl, duration)
				}
				t, closeStore, err := matrix.Start(g.store, seed, logf)
				if err != nil {
					return exit(ExitUnavailable, "verify: start %s: %v", g.store, err)
				}
				defer closeStore()
				target = t
			}
			defer target.Close()
			res, err := verify.Run(ctx, cfg, target)
			switch {
			case errors.Is(err, verify.ErrUnsupportedFault):
				return exit(ExitUnsupported, "%v", err)
			case errors.Is(err, verify.ErrInterrupted):
				return exit(ExitInterrupted, "%v", err)
			case errors.Is(err, dlock.ErrUnavailable):
				return exit(ExitUnavailable, "%v", err)
			case errors.Is(err, dlock.ErrInvalidArgument):
				return exit(ExitUsage, "%v", err)
			case err != nil:
				return exit(ExitVerifyFailed, "%v", err)
			}
			if jsonOut != "" {
				if err := writeJSONFile(jsonOut, res); err != nil {
					return err
				}
			}
			if html != "" {
				f, err := os.Create(html)
				if err != nil {
					return err
				}
				err = verify.WriteHTML(f, "dlock verify "+res.Store+" × "+res.Faults, []*verify.Result{res})
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return err
				}
			}
			if g.json() {
				g.printJSON(res.Findings)
			} else {
				printFindings(g, res)
			}
			if res.Findings.Grants == 0 {
				return exit(ExitUnavailable, "verify: %s granted nothing in the whole run (%d acquisitions failed): it measured nothing; is the store reachable, and the kind the URL's scheme says?", res.Store, res.Findings.FailedAcquires)
			}
			if res.Findings.Unsafe() {
				return exit(ExitVerifyFailed, "verify: %s under %s: a safety checker failed (see the findings)", res.Store, res.Faults)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&faults, "fault", "none", "fault(s) to inject, comma-separated (see above)")
	f.DurationVar(&duration, "duration", 12*time.Second, "length of the run (at least 5 TTLs)")
	f.DurationVar(&ttl, "ttl", time.Second, "TTL of every lease")
	f.IntVar(&clients, "clients", 4, "number of clients (each its own Locker)")
	f.IntVar(&keys, "keys", 2, "number of keys the clients contend for")
	f.Uint64Var(&seed, "seed", 0, "seed of the fault plan and the clients (0: random; printed)")
	f.StringVar(&jsonOut, "json", "", "write the result (findings and the whole history) as JSON to this file")
	f.StringVar(&html, "html", "", "write the HTML timeline of the run to this file")
	cmd.AddCommand(newVerifyMatrixCmd(g))
	return cmd
}

func printFindings(g *globals, res *verify.Result) {
	x := res.Findings
	w := g.stdout
	fmt.Fprintf(w, "store %s, faults %s, %v, %d clients, %d keys, TTL %v, seed %d\n",
		res.Store, res.Faults, res.Duration, res.Clients, res.Keys, res.TTL, res.Seed)
	fmt.Fprintf(w, "grants %d, acquisitions failed %d (%d during faults), writes accepted %d\n", x.Grants, x.FailedAcquires, x.FailedDuringFault, x.WritesAccepted)
	fmt.Fprintf(w, "double grants %d (by the store: %d), fence violations %d\n", x.DoubleGrants, x.EarlyGrants, x.FenceViolations)
	fmt.Fprintf(w, "stale writes accepted %d, refused by fencing %d\n", x.StaleWritesAccepted, x.StaleWritesRefused)
	rec := "none"
	if x.Recovery >= 0 {
		rec = fmt.Sprintf("%.2fs", x.Recovery.Seconds())
	}
	fmt.Fprintf(w, "longest gap without a grant %.2fs, recovery after heal %s, linearizable %s\n", x.LongestGap.Seconds(), rec, x.Linearizable)
	for _, v := range x.Violations {
		fmt.Fprintf(w, "  %s\n", v)
	}
	if res.Visualization != "" {
		fmt.Fprintf(w, "porcupine visualisation: %s\n", res.Visualization)
	}
}

// checkWritable reports whether a file can be written at path ("" is
// fine: no file), so that a run does not end in an error it could have
// found first. It leaves no file behind that was not there.
func checkWritable(path string) error {
	if path == "" {
		return nil
	}
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	f.Close()
	if os.IsNotExist(statErr) {
		os.Remove(path)
	}
	return nil
}

func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func newVerifyMatrixCmd(g *globals) *cobra.Command {
	var (
		o       matrix.Options
		out     string
		stores  string
		faults  string
		results string
	)
	cmd := &cobra.Command{
		Use:   "matrix",
		Short: "Run every store × fault and write docs/GUARANTEES.md and docs/verify-report.html",
		Long: `Matrix starts every store the verifier can fault (` + storeNames() + `;
real servers on loopback, stopped by PID when done), runs dlock verify for
each fault each store can take, and writes GUARANTEES.md (a table per store)
and verify-report.html (a timeline per run) into --out. It exits 1 when a
cell is UNSAFE (a checker failed where the store promises safety) or could
not run, 64 for bad flags or an unknown store or fault (before anything
runs), 130 when interrupted (nothing is written then). --out receives
GUARANTEES.md and verify-report.html, and the summary block of its
CHOOSING.md when it has one. Run it from the source tree: the dlockd stores
are built with go build. make verify runs it.`,
		Example: `  dlock verify matrix --out docs
  dlock verify matrix --short --stores redis,dlockd3 --out /tmp/v`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if stores != "" {
				o.Stores = strings.Split(stores, ",")
			}
			if faults != "" {
				o.Faults = strings.Split(faults, ",")
			}
			o.Results = results
			o.Logf = func(format string, args ...any) {
				if g.debug || strings.HasPrefix(format, "matrix:") {
					fmt.Fprintf(g.stderr, format+"\n", args...)
				}
			}
			defer matrix.Cleanup()
			if err := o.Check(); err != nil {
				return exit(ExitUsage, "verify matrix: %v", err)
			}
			for _, d := range []string{out, results} {
				if d == "" {
					continue
				}
				if err := os.MkdirAll(d, 0o755); err != nil {
					return exit(ExitUsage, "verify matrix: %v", err)
				}
				if err := checkWritable(filepath.Join(d, ".dlock-verify-probe")); err != nil {
					return exit(ExitUsage, "verify matrix: %v", err)
				}
			}
			rep, err := matrix.Run(ctx, o)
			switch {
			case errors.Is(err, verify.ErrInterrupted):
				return exit(ExitInterrupted, "verify matrix: %v (nothing written)", err)
			case err != nil:
				return exit(ExitVerifyFailed, "verify matrix: %v", err)
			}
			if err := matrix.WriteDocs(rep, out); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "wrote %s and %s (%d cells in %v)\n", filepath.Join(out, "GUARANTEES.md"), filepath.Join(out, "verify-report.html"), len(rep.Cells), rep.Elapsed.Round(time.Second))
			if err := rep.Err(); err != nil {
				return exit(ExitVerifyFailed, "%v", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "docs", "directory for GUARANTEES.md and verify-report.html")
	f.BoolVar(&o.Short, "short", false, "each store's main faults only (the matrix make test runs)")
	f.StringVar(&stores, "stores", "", "comma-separated stores to run (default all)")
	f.StringVar(&faults, "faults", "", "comma-separated faults to run (default all)")
	f.IntVar(&o.Runs, "runs", 1, "runs per cell (failover: at least 3)")
	f.DurationVar(&o.Duration, "duration", 0, "length of each run (default 12s; --short 8s)")
	f.DurationVar(&o.TTL, "ttl", time.Second, "TTL of every lease")
	f.IntVar(&o.Clients, "clients", 4, "clients per run")
	f.IntVar(&o.Keys, "keys", 2, "keys per run")
	f.Uint64Var(&o.Seed, "seed", 0, "seed (0: time-based)")
	f.StringVar(&results, "results", "", "directory for one JSON result per run (default: none written)")
	return cmd
}
