// Package cli implements the dlock command line tool: dlock run (a command
// under a lease), status, list, release --force, fence check and bench. The
// command in cmd/dlock is a thin main over Main.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-dev/dlock"
	_ "github.com/dlock-dev/dlock/drivers/dlockddriver"  // dlockd://
	_ "github.com/dlock-dev/dlock/drivers/etcddriver"    // etcd://
	_ "github.com/dlock-dev/dlock/drivers/memdriver"     // mem:// (in-process only)
	_ "github.com/dlock-dev/dlock/drivers/pgadvisory"    // pgadvisory://
	_ "github.com/dlock-dev/dlock/drivers/pgdriver"      // postgres://
	_ "github.com/dlock-dev/dlock/drivers/redisdriver"   // redis://
	_ "github.com/dlock-dev/dlock/drivers/redlockdriver" // redlock://
	_ "github.com/dlock-dev/dlock/drivers/zkdriver"      // zk://
)

// Exit codes of dlock run and the other commands, from sysexits.h.
const (
	ExitOK          = 0
	ExitUsage       = 64 // EX_USAGE: bad flags or arguments
	ExitUnavailable = 69 // EX_UNAVAILABLE: the store could not be reached; the command was not run
	ExitLost        = 70 // EX_SOFTWARE: the lease was lost while the command ran; it was terminated
	ExitHeld        = 75 // EX_TEMPFAIL: the key is held (or --wait-timeout passed); the command was not run
	ExitUnsupported = 78 // EX_CONFIG: the configured store cannot do this at all (status or list without an inspector, release --force without an override); retrying cannot help
	ExitNotFound    = 127
	ExitCannotRun   = 126
)

// DefaultStore is the store URL used when neither --store nor DLOCK_STORE
// is set: the local dlockd.
const DefaultStore = "dlockd://127.0.0.1:7450"

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

func exit(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

type globals struct {
	store  string
	output string
	stdout io.Writer
	stderr io.Writer
	stdin  io.Reader
}

func (g *globals) json() bool { return g.output == "json" }

func (g *globals) printJSON(v any) { _ = jsonTo(g.stdout).Encode(v) }

func jsonTo(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc
}

// open opens the store: exit 69 when it cannot be reached, 64 when the URL
// or configuration is wrong.
func (g *globals) open(ctx context.Context, opts ...dlock.Option) (*dlock.Locker, error) {
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := dlock.Open(octx, g.store, opts...)
	if errors.Is(err, dlock.ErrUnavailable) {
		return nil, exit(ExitUnavailable, "%w", err)
	}
	if err != nil { // a bad URL or a configuration the driver refuses
		return nil, exit(ExitUsage, "%w", err)
	}
	return l, nil
}

// Main runs the dlock tool with args (without the program name) and returns
// the process exit code.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout, stderr: stderr, stdin: stdin}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			printErr(stderr, ee.err)
		}
		return ee.code
	}
	printErr(stderr, err)
	return ExitUsage
}

func printErr(w io.Writer, err error) {
	msg := err.Error()
	if !strings.HasPrefix(msg, "dlock: ") {
		msg = "dlock: " + msg
	}
	fmt.Fprintln(w, msg)
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "dlock",
		Short: "Distributed locks with leases and fencing tokens",
		Long: `dlock runs commands under a distributed lease and inspects lock stores.

The store is a URL: --store, or the DLOCK_STORE environment variable, or
` + DefaultStore + ` (a local dlockd). Schemes: dlockd, redis, redlock, etcd,
zk, postgres, pgadvisory (and mem, which lives inside one process only).`,
		Example: `  dlock run payout:2026-09 -- ./payout --month 2026-09
  dlock run --wait --wait-timeout 5m nightly-report -- ./report.sh
  dlock status payout:2026-09
  dlock list settle:
  DLOCK_STORE=redis://127.0.0.1:6379 dlock run job -- echo hello`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	envStore := os.Getenv("DLOCK_STORE")
	if envStore == "" {
		envStore = DefaultStore
	}
	root.PersistentFlags().StringVar(&g.store, "store", envStore, "lock store URL (env DLOCK_STORE)")
	root.PersistentFlags().StringVarP(&g.output, "output", "o", "text", `output format: "text" or "json"`)
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		if g.output != "text" && g.output != "json" {
			return exit(ExitUsage, "--output must be text or json, not %q", g.output)
		}
		return nil
	}
	root.AddCommand(newRunCmd(g), newStatusCmd(g), newListCmd(g), newReleaseCmd(g), newFenceCmd(g), newBenchCmd(g))
	root.AddCommand(newVersionCmd(g))
	return root
}
