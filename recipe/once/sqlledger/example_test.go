package sqlledger_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/dlock-dev/dlock"
	_ "github.com/dlock-dev/dlock/drivers/memdriver" // mem://
	"github.com/dlock-dev/dlock/recipe/once"
	"github.com/dlock-dev/dlock/recipe/once/sqlledger"
)

// The ledger in a SQLite file (import modernc.org/sqlite); with
// "postgres://…" (import github.com/jackc/pgx/v5/stdlib) it is a table in
// PostgreSQL, whose clock every node then shares.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "once-example-")
	defer os.RemoveAll(dir)
	ledger, err := sqlledger.Open(ctx, "sqlite:"+filepath.Join(dir, "ledger.db"))
	if err != nil {
		panic(err)
	}
	defer ledger.Close()
	locker, err := dlock.Open(ctx, "mem://example-sqlledger")
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	for range 2 {
		res, err := once.Run(ctx, locker, ledger, "invoices", once.Monthly, func(ctx context.Context, a once.Attempt) error {
			fmt.Println("sending the invoices, fence > 0:", a.Fence > 0)
			return nil
		})
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Outcome, res.Record.State, "attempt", res.Record.Attempt)
	}
	// Output:
	// sending the invoices, fence > 0: true
	// ran finished attempt 1
	// done finished attempt 1
}
