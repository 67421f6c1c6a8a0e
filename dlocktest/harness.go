package dlocktest

import (
	"context"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

// Harness tells the conformance suite how to reach one real store.
type Harness struct {
	// Name names the store in messages ("redis", "dlockd", ...).
	Name string

	// NewDriver opens a new driver on the same store, as another process
	// would. Two drivers from it must act as two independent clients.
	// Required. The suite closes every driver it opens.
	NewDriver func(ctx context.Context) (driver.Driver, error)

	// StopStore makes the store unreachable (stops the server process) and
	// StartStore brings it back on the same address with the same data.
	// When both are nil the store-outage subtests are skipped by name.
	StopStore  func() error
	StartStore func() error

	// TTL is the lease TTL the suite uses for expiry tests. Zero means
	// 1 second.
	TTL time.Duration

	// ForceExpiry, when set, makes the store end the grants of the client
	// behind d as if that client had stopped renewing (for stores whose
	// expiry is a session, not a per-grant TTL: ZooKeeper). When nil, the
	// suite blocks the client's renewals and waits for the TTL.
	ForceExpiry func(ctx context.Context, d driver.Driver) error

	// NoFence says the driver issues no fencing tokens (Grant.Fence is 0);
	// the fence subtests are then skipped with NoFenceReason.
	NoFence       bool
	NoFenceReason string
}
