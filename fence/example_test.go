package fence_test

import (
	"context"
	"errors"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/fence"
)

// A guarded UPDATE: the row changes only when the lease's fence is greater
// than the one stored with it.
func ExampleExecPgx() {
	ctx := context.Background()
	locker, _ := dlock.Open(ctx, "postgres://app@db/app")
	pool, _ := pgxpool.New(ctx, "postgres://app@db/app")
	lease, err := locker.Acquire(ctx, "account:42")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	err = fence.ExecPgx(lease.Context(), pool,
		`UPDATE accounts SET balance = balance - $1, fence = $2 WHERE id = $3 AND fence < $2`,
		100, int64(lease.Fence()), 42)
	if errors.Is(err, dlock.ErrStaleFence) {
		log.Print("a newer holder has written: this one stops")
	}
}

// The fence check and the protected writes commit together.
func ExampleTable_Advance() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://app@db/app")
	var lease *dlock.Lease // from locker.Acquire(ctx, "ledger")
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := (fence.Table{}).Advance(ctx, fence.Pgx(tx), "ledger", lease.Fence()); err != nil {
		log.Fatal(err) // ErrStaleFence: a newer holder has written
	}
	if _, err := tx.Exec(ctx, `INSERT INTO ledger (entry) VALUES ($1)`, "settled"); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}

// A Redis value that only a newer holder can overwrite.
func ExampleRedisSet() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	var lease *dlock.Lease // from locker.Acquire(ctx, "report")
	if err := fence.RedisSet(ctx, client, "report", "contents", lease.Fence()); errors.Is(err, dlock.ErrStaleFence) {
		log.Print("a newer holder has written the report")
	}
}
