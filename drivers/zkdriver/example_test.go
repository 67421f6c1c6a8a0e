package zkdriver_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/dlock-dev/dlock"
	_ "github.com/dlock-dev/dlock/drivers/zkdriver" // registers "zk"
)

// Opening a locker by URL, acquiring a lease and passing its fence to the
// protected resource. (Not run: it needs a real server.)
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "zk://127.0.0.1:2181/dlock?session_timeout=4s")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, "settle:42", dlock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.Background())

	// Work under lease.Context(): it is cancelled when the lease is lost.
	fmt.Println("fence", lease.Fence())
}
