package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/text/width"

	"github.com/dlock-dev/dlock"
)

// MaxReasonBytes bounds release --force --reason, as dlockd does.
const MaxReasonBytes = 1024

// holderJSON is the JSON shape of a grant in status, list and release.
type holderJSON struct {
	Key         string  `json:"key"`
	Held        bool    `json:"held"`
	Fence       uint64  `json:"fence,omitempty"`
	Holder      string  `json:"holder,omitempty"`
	TTLSeconds  float64 `json:"ttl_seconds,omitempty"`
	LeftSeconds float64 `json:"left_seconds,omitempty"`
	Waiters     *int    `json:"waiters,omitempty"`
	// LockDelaySeconds: a free key in its lock-delay refuses grants for
	// this long (dlockd).
	LockDelaySeconds float64 `json:"lock_delay_seconds,omitempty"`
	// PermitsHeld (status of a free key): how many of its semaphore slots
	// KEY/permit-N (dlock run --permits) are held, where the store can list.
	PermitsHeld int `json:"permits_held,omitempty"`
}

// heldPermits returns how many semaphore slots KEY/permit-N of key are
// held (and permits of the native semaphore's key KEY/permit-shared, which
// List shows one entry per grant), or -1 when the store cannot list them.
func heldPermits(ctx context.Context, l *dlock.Locker, key string) int {
	infos, err := l.List(ctx, key+"/permit-")
	if err != nil {
		return -1
	}
	n := 0
	for _, h := range infos {
		i, err := strconv.Atoi(strings.TrimPrefix(h.Key, key+"/permit-"))
		if err == nil && i >= 0 && PermitKey(key, i) == h.Key || h.Key == permitLeaseKey(key, nativePermit) { // native: one entry per grant (permits.go)
			n++
		}
	}
	return n
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

// quoteIfControl returns s as it is, or Go-quoted ("a\nb", "\u202e") when
// needsQuote(s), so that a key or holder cannot break a table or a terminal,
// nor reorder what a terminal shows.
func quoteIfControl(s string) string {
	if needsQuote(s) {
		return strconv.Quote(s)
	}
	return s
}

// needsQuote reports whether s holds a control character, a Unicode format
// character (category Cf: bidi overrides such as U+202E, zero-width
// characters) or is not valid UTF-8.
func needsQuote(s string) bool {
	return strings.IndexFunc(s, unsafeRune) >= 0
}

func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == utf8.RuneError
}

// runeName names a control or format character for a message: U+000A (a
// newline).
func runeName(r rune) string {
	names := map[rune]string{'\n': "a newline", '\r': "a carriage return", '\t': "a tab", 0x1b: "an escape", 0: "a NUL", 0x7f: "a DEL"}
	if n := names[r]; n != "" {
		return fmt.Sprintf("U+%04X (%s)", r, n)
	}
	if unicode.Is(unicode.Cf, r) {
		return fmt.Sprintf("U+%04X (a format character)", r)
	}
	return fmt.Sprintf("U+%04X", r)
}

// displayWidth is the number of terminal columns s takes: 2 for an East
// Asian wide or fullwidth rune, 0 for a combining mark, 1 for any other.
func displayWidth(s string) int {
	n := 0
	for _, r := range s {
		switch {
		case unicode.In(r, unicode.Mn, unicode.Me):
		case width.LookupRune(r).Kind() == width.EastAsianWide, width.LookupRune(r).Kind() == width.EastAsianFullwidth:
			n += 2
		default:
			n++
		}
	}
	return n
}

// writeTable writes rows as columns separated by two spaces, each padded to
// its widest cell's display width (text/tabwriter counts runes, so a wide
// key would misalign the columns after it).
func writeTable(w io.Writer, rows [][]string) error {
	var widths []int
	for _, row := range rows {
		for i, c := range row {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], displayWidth(c))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		for i, c := range row {
			b.WriteString(c)
			if i < len(row)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-displayWidth(c)+2))
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func waitersText(n int) string {
	if n < 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

// delayText rounds a lock-delay's time left for display: to 100 ms (1.8s),
// never to 0 (a delay under 50 ms shows as 1ms or more).
func delayText(d time.Duration) time.Duration {
	if r := d.Round(100 * time.Millisecond); r > 0 {
		return r
	}
	return max(d.Round(time.Millisecond), time.Millisecond)
}

func newStatusCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status KEY",
		Short: "Show who holds KEY: holder, fence, time left, waiters",
		Long: `Status shows the current grant of KEY: the holder description, the fence,
the time left before the store expires it, and the queued waiters where the
store keeps a queue ("-" where it does not). A free key prints "free".

A key or holder with control characters (a newline, an escape) is printed
quoted, as "a\nb". A key in dlockd's lock-delay (granted to nobody for a
moment after its holder was lost without a release: an expiry or a force
release) is not free: it shows as "not held; in its lock-delay for 1.8s
more (grants refused until then)", with the waiters queued if any, and
with -o json as {"held": false, "lock_delay_seconds": 1.8}. A key with
waiters queued but no holder (the next grant under way) shows as "not
held, N waiter(s) queued".

A free key whose semaphore slots (dlock run --permits: KEY/permit-N) are
held says so: "free as a lock; 2 of its permit slots are held".

A store that cannot be reached (down, restarting, electing a leader) is
retried for --retry-for (default 5s), as dlock run does.

Exit status: 0 (held or free), 64 for an invalid key, 69 when the store
could not be reached, 78 when the store cannot inspect (Redlock). With -o
json an error is {"error", "code", "exit_code"} on stdout.`,
		Example: `  dlock status payout:2026-09
  dlock status -o json settle:{m00042}:2026-09-30`,
		Args:              exactArgs(1, "dlock status KEY"),
		ValidArgsFunction: completeKeys(g, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var info dlock.HolderInfo
			var err error
			permits := -1
			if rerr := g.retrying(cmd.Context(), "status", args[0], func(ctx context.Context) error {
				l, oerr := g.open(ctx)
				if oerr != nil {
					return oerr
				}
				defer l.Close()
				info, err = l.Inspect(ctx, args[0])
				if errors.Is(err, dlock.ErrNotAcquired) {
					permits = heldPermits(ctx, l, args[0])
					return nil
				}
				return err
			}); rerr != nil {
				return rerr
			}
			switch {
			case errors.Is(err, dlock.ErrNotAcquired):
				// Not held. A lock-delay (dlockd, after a lost grant) or
				// waiters on a free key (the next grant under way, or held
				// back by the delay): not "free" then.
				queued := info.Waiters > 0
				delay := info.LockDelay
				if g.json() {
					out := holderJSON{Key: args[0], LockDelaySeconds: delay.Round(time.Millisecond).Seconds()}
					if queued {
						w := info.Waiters
						out.Waiters = &w
					}
					out.PermitsHeld = max(permits, 0)
					g.printJSON(out)
					return nil
				}
				key := quoteIfControl(args[0])
				switch {
				case delay > 0 && queued:
					fmt.Fprintf(g.stdout, "%s: not held; in its lock-delay for %v more (grants refused until then), %d waiter(s) queued\n", key, delayText(delay), info.Waiters)
				case delay > 0:
					fmt.Fprintf(g.stdout, "%s: not held; in its lock-delay for %v more (grants refused until then)\n", key, delayText(delay))
				case queued:
					fmt.Fprintf(g.stdout, "%s: not held, %d waiter(s) queued (a lock-delay after a lost grant, or the next grant under way)\n", key, info.Waiters)
				case permits > 0:
					fmt.Fprintf(g.stdout, "%s: free as a lock; %d of its permit slots are held (dlock run --permits; dlock list %s)\n", key, permits, quoteIfControl(args[0]+"/permit-"))
				default:
					fmt.Fprintf(g.stdout, "%s: free\n", key)
				}
				return nil
			}
			if g.json() {
				g.printJSON(toJSON(info))
				return nil
			}
			fmt.Fprintf(g.stdout, "key:      %s\nheld by:  %s\nfence:    %d\nttl:      %v\nleft:     %v\nwaiters:  %s\n",
				quoteIfControl(info.Key), quoteIfControl(info.Holder), info.Fence, info.TTL, info.Remaining.Round(time.Millisecond), waitersText(info.Waiters))
			return nil
		},
	}
	addRetryFlag(cmd, g)
	return cmd
}

func newListCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list [PREFIX]",
		Short: "List held keys, optionally those starting with PREFIX",
		Long: `List shows the held keys that start with PREFIX (all held keys without
one), sorted by key, with their fence, time left, waiters and holder.

A key or holder with control characters (a newline, an escape) is printed
quoted, as "a\nb", so that one row stays one line.

A key or holder with Unicode format characters (a bidi override such as
U+202E) is quoted the same way; columns are padded by display width.
A store that cannot be reached is retried for --retry-for (default 5s).

Exit status: 0, 69 when the store could not be reached, 78 when the store
cannot list (Redlock). With -o json an error is {"error", "code",
"exit_code"} on stdout.`,
		Example: `  dlock list
  dlock list settle: -o json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return exit(ExitUsage, "usage: dlock list [PREFIX] (one prefix, got %d arguments)", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			var infos []dlock.HolderInfo
			if err := g.retrying(cmd.Context(), "list", prefix, func(ctx context.Context) error {
				l, err := g.open(ctx)
				if err != nil {
					return err
				}
				defer l.Close()
				infos, err = l.List(ctx, prefix)
				return err
			}); err != nil {
				return err
			}
			if g.json() {
				out := make([]holderJSON, 0, len(infos))
				for _, h := range infos {
					out = append(out, toJSON(h))
				}
				g.printJSON(out)
				return nil
			}
			rows := [][]string{{"KEY", "FENCE", "LEFT", "WAITERS", "HOLDER"}}
			for _, h := range infos {
				rows = append(rows, []string{quoteIfControl(h.Key), strconv.FormatUint(h.Fence, 10), h.Remaining.Round(time.Millisecond).String(), waitersText(h.Waiters), quoteIfControl(h.Holder)})
			}
			return writeTable(g.stdout, rows)
		},
	}
	addRetryFlag(cmd, g)
	return cmd
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
  64   bad flags or arguments (--force or --reason missing, a reason over
       1024 bytes or with control characters)
  69   the store could not be reached
  78   the store has no force release: only dlockd, Redis and mem have one
       (etcd, ZooKeeper, PostgreSQL and Redlock do not); wait out the TTL`,
		Example:           `  dlock release --force payout:2026-09 --reason "pod payout-7 evicted, node lost"`,
		Args:              exactArgs(1, "dlock release --force KEY --reason TEXT"),
		ValidArgsFunction: completeKeys(g, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !force {
				return exit(ExitUsage, "release needs --force: a holder releases its own lease by ending; this removes someone else's grant")
			}
			if strings.TrimSpace(reason) == "" {
				return exit(ExitUsage, "release --force needs --reason TEXT (it is logged)")
			}
			if err := checkReason(reason); err != nil {
				return err
			}
			// Retried like run: a store that is restarting or electing a
			// leader refused the request before acting on it.
			var info dlock.HolderInfo
			notHeld := false
			if err := g.retrying(cmd.Context(), "release --force", args[0], func(ctx context.Context) error {
				l, err := g.open(ctx)
				if err != nil {
					return err
				}
				defer l.Close()
				info, err = l.ForceRelease(ctx, args[0], reason)
				if errors.Is(err, dlock.ErrNotAcquired) {
					notHeld = true
					return nil
				}
				return err
			}); err != nil {
				return err
			}
			if notHeld {
				return &exitError{code: 1, kind: codeNotHeld, err: fmt.Errorf("%s is not held", quoteIfControl(args[0]))}
			}
			if g.json() {
				g.printJSON(toJSON(info))
				return nil
			}
			fmt.Fprintf(g.stdout, "released %s (fence %d, held by %s)\n", quoteIfControl(args[0]), info.Fence, quoteIfControl(info.Holder))
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "remove the grant whoever holds it")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required; logged)")
	addRetryFlag(cmd, g)
	return cmd
}

func newFenceCmd(g *globals) *cobra.Command {
	fence := &cobra.Command{
		Use:   "fence",
		Short: "Fencing token commands",
		Example: `  # inside dlock run: is my grant still the current one?
  dlock run payout:2026-09 -- sh -c 'dlock fence check "$DLOCK_KEY" "$DLOCK_FENCE" && ./write-result'`,
	}
	check := &cobra.Command{
		Use:   "check KEY FENCE",
		Short: "Check whether FENCE is the current grant of KEY",
		Long: `Check answers whether FENCE is the fence of KEY's current grant (Chubby's
sequencer check), for resources that cannot store a fence themselves. Exit
status 0 and "current" when it is; 1 and "not current (current fence N)"
when the key is held under another fence, 1 and "not current (the key is
free)" when nobody holds it ("not current (the key is not held; in its
lock-delay for 1.8s more)" while dlockd refuses grants after a lost
holder). Inside dlock run, pass "$DLOCK_FENCE". This is the weaker check: the answer can change the
moment after it is given, so a resource that can store the greatest fence it
has seen (package dlock/fence) should do that instead.`,
		Example:           `  dlock fence check payout:2026-09 "$DLOCK_FENCE" && ./write-result`,
		ValidArgsFunction: completeKeys(g, 0),
		Args: func(cmd *cobra.Command, args []string) error {
			switch len(args) {
			case 2:
				return nil
			case 1:
				return exit(ExitUsage, "fence check needs the fence to check: dlock fence check %s FENCE; inside dlock run it is \"$DLOCK_FENCE\"", args[0])
			}
			return exit(ExitUsage, "usage: dlock fence check KEY FENCE (inside dlock run: dlock fence check \"$DLOCK_KEY\" \"$DLOCK_FENCE\")")
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[1] == "" {
				return exit(ExitUsage, "FENCE is empty: is DLOCK_FENCE set? it is, inside dlock run (dlock run KEY -- sh -c 'dlock fence check KEY \"$DLOCK_FENCE\"')")
			}
			f, err := strconv.ParseUint(args[1], 10, 64)
			if err != nil || f == 0 {
				return exit(ExitUsage, "FENCE must be a positive integer (the DLOCK_FENCE of a dlock run), not %q", args[1])
			}
			var info dlock.HolderInfo
			if rerr := g.retrying(cmd.Context(), "fence check", args[0], func(ctx context.Context) error {
				l, oerr := g.open(ctx)
				if oerr != nil {
					return oerr
				}
				defer l.Close()
				info, err = l.Inspect(ctx, args[0])
				if errors.Is(err, dlock.ErrNotAcquired) {
					return nil
				}
				return err
			}); rerr != nil {
				return rerr
			}
			free := err != nil
			current := !free && info.Fence == f
			switch {
			case g.json():
				out := map[string]any{"key": args[0], "fence": f, "current": current, "free": free}
				if !free {
					out["current_fence"] = info.Fence
				}
				if free && info.LockDelay > 0 {
					out["lock_delay_seconds"] = info.LockDelay.Round(time.Millisecond).Seconds()
				}
				g.printJSON(out)
			case current:
				fmt.Fprintln(g.stdout, "current")
			case free && info.LockDelay > 0:
				fmt.Fprintf(g.stdout, "not current (the key is not held; in its lock-delay for %v more)\n", delayText(info.LockDelay))
			case free:
				fmt.Fprintln(g.stdout, "not current (the key is free)")
			default:
				fmt.Fprintf(g.stdout, "not current (current fence %d)\n", info.Fence)
			}
			if !current {
				return &exitError{code: 1} // the answer, not an error: no JSON error object
			}
			return nil
		},
	}
	addRetryFlag(check, g)
	fence.AddCommand(check)
	return fence
}

// exactArgs is cobra.ExactArgs with a usage line and exit 64.
func exactArgs(n int, usage string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return exit(ExitUsage, "usage: %s (got %d arguments)", usage, len(args))
		}
		return nil
	}
}

// checkReason refuses a release --force --reason that dlockd would: over
// MaxReasonBytes, not UTF-8, or with a control or format character (named).
func checkReason(reason string) error {
	switch {
	case len(reason) > MaxReasonBytes:
		return exit(ExitUsage, "--reason must be at most %d bytes (it is logged), got %d bytes", MaxReasonBytes, len(reason))
	case !utf8.ValidString(reason):
		return exit(ExitUsage, "--reason is not valid UTF-8 (it is logged)")
	}
	if i := strings.IndexFunc(reason, unsafeRune); i >= 0 {
		r, _ := utf8.DecodeRuneInString(reason[i:])
		return exit(ExitUsage, "--reason has a control character, %s, at byte %d: give one line of printable text (it is logged)", runeName(r), i)
	}
	return nil
}
