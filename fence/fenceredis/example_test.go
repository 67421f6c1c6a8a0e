package fenceredis_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock"
	_ "github.com/dlock-dev/dlock/drivers/redisdriver" // dlock.Open("redis://…")
	"github.com/dlock-dev/dlock/fence/fenceredis"
)

// A Redis value that only a newer holder can overwrite. The lock and the
// value live in the same Redis, REDIS_URL (such as redis://127.0.0.1:6379).
func ExampleSet() {
	ctx := context.Background()
	url := os.Getenv("REDIS_URL")
	locker, err := dlock.Open(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := locker.Close(); err != nil {
			log.Print(err)
		}
	}()
	opts, err := redis.ParseURL(url)
	if err != nil {
		log.Fatal(err)
	}
	client := redis.NewClient(opts)
	defer func() {
		if err := client.Close(); err != nil {
			log.Print(err)
		}
	}()

	lease, err := locker.Acquire(ctx, "report")
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := lease.Release(ctx); err != nil {
			log.Print(err)
		}
	}()
	err = fenceredis.Set(lease.Context(), client, "report:contents", "monthly totals", lease.Fence())
	switch {
	case errors.Is(err, dlock.ErrStaleFence):
		fmt.Println("a newer holder has written the report: this one stops")
		return
	case err != nil:
		log.Fatal(err)
	}
	value, _, err := fenceredis.Get(ctx, client, "report:contents")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("report:", value)
}
