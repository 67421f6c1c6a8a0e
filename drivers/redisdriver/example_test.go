package redisdriver_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/drivers/redisdriver"
)

// Opening a Locker by URL: the driver owns its client, PINGs it at once and
// publishes release hints.
func Example_openByURL() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "redis://127.0.0.1:6379/0?prefix=myapp:locks")
	if err != nil {
		log.Fatal(err) // matches dlock.ErrUnavailable when Redis is down
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "settle:42", dlock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.Background())
	fmt.Println("fence", lease.Fence())
}

// Constructing the driver over a client the application already has (a
// *redis.ClusterClient or *redis.Ring works the same way). The driver never
// closes it.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()

	locker := dlock.New(redisdriver.New(rdb, &redisdriver.Options{
		Prefix:       "myapp:locks",
		ReleaseHints: true,
	}), dlock.WithStoreName("redis"))
	defer locker.Close()

	err := locker.Do(context.Background(), "nightly-report", func(ctx context.Context) error {
		// ctx is cancelled with cause dlock.ErrLeaseLost if the lease is lost.
		return nil
	})
	if err != nil {
		log.Print(err)
	}
}
