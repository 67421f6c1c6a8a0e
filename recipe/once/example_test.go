package once_test

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-dev/dlock"
	_ "github.com/dlock-dev/dlock/drivers/memdriver" // mem://
	"github.com/dlock-dev/dlock/recipe/once"
)

// Two nodes try the nightly report; it runs once for the day. The window
// comes from the ledger's clock (here a MemLedger on a fixed clock; in
// production sqlledger, whose clock is the database's), so the second
// node's clock, a day ahead, changes nothing.
func ExampleRun() {
	ctx := context.Background()
	ledger := once.NewMemLedger(func() time.Time { return time.Date(2026, 12, 1, 7, 0, 0, 0, time.UTC) })
	report := func(ctx context.Context, a once.Attempt) error {
		// Pass a.Fence to what you write; stop when ctx ends.
		fmt.Printf("report for %s, attempt %d\n", a.Window.ID, a.Number)
		return nil
	}
	for node, skew := range []time.Duration{0, 24 * time.Hour} {
		locker, err := dlock.Open(ctx, "mem://example-once") // redis://, dlockd://, postgres:// ...
		if err != nil {
			panic(err)
		}
		clock := func() time.Time { return time.Now().Add(skew) }
		res, err := once.Run(ctx, locker, ledger, "nightly-report", once.Daily, report,
			once.WithNode(fmt.Sprint("node-", node)), once.WithClock(clock))
		if err != nil {
			panic(err)
		}
		fmt.Printf("node-%d: %s (window %s, finished by %s)\n", node, res.Outcome, res.Window.ID, res.Record.Node)
		locker.Close()
	}
	// Output:
	// report for 2026-12-01, attempt 1
	// node-0: ran (window 2026-12-01, finished by node-0)
	// node-1: done (window 2026-12-01, finished by node-0)
}

// A job every 15 minutes, parsed as the CLI's --once-per takes it.
func ExampleParsePeriod() {
	p, err := once.ParsePeriod("15m")
	if err != nil {
		panic(err)
	}
	w := p.Window(time.Date(2026, 12, 1, 7, 40, 0, 0, time.UTC))
	fmt.Println(w.ID, w.End.Format(time.Kitchen))
	// Output: 2026-12-01T07:30:00Z/15m0s 7:45AM
}

// Begin and End are Run's steps, for a caller that acquires the job's lock
// and runs the work itself (as dlock run --once-per does with a command).
func ExampleBegin() {
	ctx := context.Background()
	ledger := once.NewMemLedger(func() time.Time { return time.Date(2026, 12, 1, 7, 0, 0, 0, time.UTC) })
	locker, err := dlock.Open(ctx, "mem://example-begin")
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, once.Key("backup"))
	if err != nil {
		panic(err)
	}
	defer lease.Release(ctx)
	res, err := once.Begin(ctx, ledger, lease, "backup", once.Hourly)
	if err != nil {
		panic(err)
	}
	if res.Outcome == once.OutcomeRan { // started: do the work, then record its end
		fmt.Println("backing up for", res.Window.ID)
		res, err = once.End(ctx, ledger, lease, res, nil)
		if err != nil {
			panic(err)
		}
	}
	fmt.Println(res.Record.State)
	// Output:
	// backing up for 2026-12-01T07Z
	// finished
}
