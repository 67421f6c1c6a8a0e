package cli

import (
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-dev/dlock"
)

// holderJSON is the JSON shape of a grant in status, list and release.
type holderJSON struct {
	Key         string  `json:"key"`
	Held        bool    `json:"held"`
	Fence       uint64  `json:"fence,omitempty"`
	Holder      string  `json:"holder,omitempty"`
	TTLSeconds  float64 `json:"ttl_seconds,omitempty"`
	LeftSeconds float64 `json:"left_seconds,omitempty"`
	Waiters     *int    `json:"waiters,omitempty"`
}

func toJSON(h dlock.HolderInfo) holderJSON {
	out := holderJSON{Key: h.Key, Held: true, Fence: h.Fence, Holder: h.Holder,
		TTLSeconds: h.TTL.Seconds(), LeftSeconds: h.Remaining.Seconds()}
	if h.Waiters >= 0 {
		w := h.Waiters
		out.Waiters = &w
	}
	return out
}

func waitersText(n int) string {
	if n < 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func newStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status KEY",
		Short: "Show who holds KEY: holder, fence, time left, waiters",
		Long: `Status shows the current grant of KEY: the holder description, the fence,
the time left before the store expires it, and the queued waiters where the
store keeps a queue ("-" where it does not). A free key prints "free".

Exit status: 0 (held or free), 69 when the store could not be reached, 78
when the store cannot inspect (Redlock).`,
		Example: `  dlock status payout:2026-09
  dlock status -o json settle:{m00042}:2026-09-30`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer l.Close()
			info, err := l.Inspect(cmd.Context(), args[0])
			switch {
			case errors.Is(err, dlock.ErrNotAcquired):
				if g.json() {
					g.printJSON(holderJSON{Key: args[0]})
				} else {
					fmt.Fprintf(g.stdout, "%s: free\n", args[0])
				}
				return nil
			case err != nil:
				return storeErr(err)
			}
			if g.json() {
				g.printJSON(toJSON(info))
				return nil
			}
			fmt.Fprintf(g.stdout, "key:      %s\nheld by:  %s\nfence:    %d\nttl:      %v\nleft:     %v\nwaiters:  %s\n",
				info.Key, info.Holder, info.Fence, info.TTL, info.Remaining.Round(time.Millisecond), waitersText(info.Waiters))
			return nil
		},
	}
}

func newListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list [PREFIX]",
		Short: "List held keys, optionally those starting with PREFIX",
		Long: `List shows the held keys that start with PREFIX (all held keys without
one), sorted by key, with their fence, time left, waiters and holder.

Exit status: 0, 69 when the store could not be reached, 78 when the store
cannot list (Redlock).`,
		Example: `  dlock list
  dlock list settle: -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			l, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer l.Close()
			infos, err := l.List(cmd.Context(), prefix)
			if err != nil {
				return storeErr(err)
			}
			if g.json() {
				out := make([]holderJSON, 0, len(infos))
				for _, h := range infos {
					out = append(out, toJSON(h))
				}
				g.printJSON(out)
				return nil
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tFENCE\tLEFT\tWAITERS\tHOLDER")
			for _, h := range infos {
				fmt.Fprintf(tw, "%s\t%d\t%v\t%s\t%s\n", h.Key, h.Fence, h.Remaining.Round(time.Millisecond), waitersText(h.Waiters), h.Holder)
			}
			return tw.Flush()
		},
	}
}

func newReleaseCmd(g *globals) *cobra.Command {
	var force bool
	var reason string
	cmd := &cobra.Command{
		Use:   "release --force KEY --reason TEXT",
		Short: "Remove a dead holder's grant (operator override)",
		Long: `Release --force removes KEY's current grant whoever holds it, for a holder
known to be dead whose TTL is too long to wait out. The next grant still
gets a greater fence, so a holder that was in fact alive is fenced out at the
resource. The reason is required; it is logged with the removed grant (and
by dlockd too). On dlockd the holder hears of the loss at once (its dlock
run exits 70) and the next waiter is granted.

Exit status:
  0    the grant was removed
  1    KEY is not held
  64   bad flags or arguments (--force or --reason missing)
  69   the store could not be reached
  78   the store has no force release: only dlockd, Redis and mem have one
       (etcd, ZooKeeper, PostgreSQL and Redlock do not); wait out the TTL`,
		Example: `  dlock release --force payout:2026-09 --reason "pod payout-7 evicted, node lost"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !force {
				return exit(ExitUsage, "release needs --force: a holder releases its own lease by ending; this removes someone else's grant")
			}
			if reason == "" {
				return exit(ExitUsage, "release --force needs --reason TEXT (it is logged)")
			}
			l, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer l.Close()
			info, err := l.ForceRelease(cmd.Context(), args[0], reason)
			if errors.Is(err, dlock.ErrNotAcquired) {
				return exit(1, "%s is not held", args[0])
			}
			if err != nil {
				return storeErr(err)
			}
			if g.json() {
				g.printJSON(toJSON(info))
				return nil
			}
			fmt.Fprintf(g.stdout, "released %s (fence %d, held by %s)\n", args[0], info.Fence, info.Holder)
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "remove the grant whoever holds it")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required; logged)")
	return cmd
}

func newFenceCmd(g *globals) *cobra.Command {
	fence := &cobra.Command{Use: "fence", Short: "Fencing token commands"}
	fence.AddCommand(&cobra.Command{
		Use:   "check KEY FENCE",
		Short: "Check whether FENCE is the current grant of KEY",
		Long: `Check answers whether FENCE is the fence of KEY's current grant (Chubby's
sequencer check), for resources that cannot store a fence themselves. Exit
status 0 and "current" when it is; 1 and "not current" when the key is free
or held under another fence. This is the weaker check: the answer can change the
moment after it is given, so a resource that can store the greatest fence it
has seen (package dlock/fence) should do that instead.`,
		Example: `  dlock fence check payout:2026-09 "$DLOCK_FENCE" && ./write-result`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := strconv.ParseUint(args[1], 10, 64)
			if err != nil || f == 0 {
				return exit(ExitUsage, "FENCE must be a positive integer, not %q", args[1])
			}
			l, err := g.open(cmd.Context())
			if err != nil {
				return err
			}
			defer l.Close()
			info, err := l.Inspect(cmd.Context(), args[0])
			if err != nil && !errors.Is(err, dlock.ErrNotAcquired) {
				return storeErr(err)
			}
			current := err == nil && info.Fence == f
			if g.json() {
				g.printJSON(map[string]any{"key": args[0], "fence": f, "current": current, "current_fence": info.Fence})
			} else if current {
				fmt.Fprintln(g.stdout, "current")
			} else {
				fmt.Fprintf(g.stdout, "not current (current fence %d; 0: the key is free)\n", info.Fence)
			}
			if !current {
				return &exitError{code: 1}
			}
			return nil
		},
	})
	return fence
}

// storeErr maps a store error to an exit code: 69 when unreachable, 78 when
// the store cannot do the operation, 64 for an invalid key, 1 otherwise.
func storeErr(err error) error {
	switch {
	case errors.Is(err, dlock.ErrUnavailable):
		return exit(ExitUnavailable, "%w", err)
	case errors.Is(err, dlock.ErrUnsupported):
		return exit(ExitUnsupported, "%w (see the driver's docs for what each store can do)", err)
	case errors.Is(err, dlock.ErrInvalidKey):
		return exit(ExitUsage, "%w", err)
	}
	return exit(1, "%w", err)
}
