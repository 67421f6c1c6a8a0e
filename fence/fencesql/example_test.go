package fencesql_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-dev/dlock"
	_ "github.com/dlock-dev/dlock/drivers/pgdriver" // dlock.Open("postgres://…")
	"github.com/dlock-dev/dlock/fence/fencesql"
)

// A guarded UPDATE: the row changes only when the lease's fence is greater
// than the one stored with it. The lock and the row live in the same
// PostgreSQL, DATABASE_URL (such as postgres://app@db/app), which holds
// accounts (id int PRIMARY KEY, balance int, fence bigint NOT NULL DEFAULT 0).
func ExampleExecPgx() {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	locker, err := dlock.Open(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := locker.Close(); err != nil {
			log.Print(err)
		}
	}()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	lease, err := locker.Acquire(ctx, "account:42")
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := lease.Release(ctx); err != nil {
			log.Print(err)
		}
	}()
	f, err := fencesql.Param(lease.Fence())
	if err != nil {
		log.Fatal(err)
	}
	err = fencesql.ExecPgx(lease.Context(), pool,
		`UPDATE accounts SET balance = balance - $1, fence = $2 WHERE id = $3 AND fence < $2`,
		100, f, 42)
	switch {
	case errors.Is(err, dlock.ErrStaleFence):
		fmt.Println("a newer holder has written: this one stops")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println("debited account 42")
	}
}

// The fence check and the protected writes commit together: Advance raises
// the fence of resource "ledger" in the transaction, or refuses a fence not
// greater than the stored one. DATABASE_URL holds
// ledger (entry text).
func ExampleTable_Advance() {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	locker, err := dlock.Open(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := locker.Close(); err != nil {
			log.Print(err)
		}
	}()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	fences := fencesql.Table{} // dlock_fences
	if err := fences.Create(ctx, fencesql.Pgx(pool)); err != nil {
		log.Fatal(err)
	}

	lease, err := locker.Acquire(ctx, "ledger")
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := lease.Release(ctx); err != nil {
			log.Print(err)
		}
	}()
	tx, err := pool.Begin(lease.Context())
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		// After Commit, Rollback does nothing and says so.
		if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			log.Print(err)
		}
	}()
	err = fences.Advance(lease.Context(), fencesql.Pgx(tx), "ledger", lease.Fence())
	if errors.Is(err, dlock.ErrStaleFence) {
		fmt.Println("a newer holder has written: this one stops")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.Exec(lease.Context(), `INSERT INTO ledger (entry) VALUES ($1)`, "settled"); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(lease.Context()); err != nil {
		log.Fatal(err)
	}
	fmt.Println("settled")
}
