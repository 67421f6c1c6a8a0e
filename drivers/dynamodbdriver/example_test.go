package dynamodbdriver_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/drivers/dynamodbdriver"
)

// Opening a locker by URL (credentials from the AWS SDK's chain), acquiring
// a lease and passing its fence to the protected resource. (Not run: it
// needs DynamoDB.)
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "dynamodb://locks?region=eu-west-1")
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	// Acquire polls; a holder that died is taken over a TTL after this
	// client first saw it, so wait longer than the TTL.
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	lease, err := locker.Acquire(actx, "settle:42", dlock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.Background())

	// Work under lease.Context(): it is cancelled when the lease is lost.
	fmt.Println("fence", lease.Fence())
}

// Creating the table once, from a deployment step, with a client of the
// application's own configuration. (Not run: it needs DynamoDB.)
func ExampleDriver_Migrate() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion("eu-west-1"))
	if err != nil {
		log.Fatal(err)
	}
	d, err := dynamodbdriver.New(dynamodb.NewFromConfig(cfg), "locks", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	if err := d.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	locker := dlock.New(d)
	defer locker.Close()
}
