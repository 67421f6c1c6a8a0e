package dlocktest

import (
	"context"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

// Harness tells the conformance suite how to reach one real store.
//
// Every fault a harness can inject is optional; a subtest that needs a
// missing one is skipped by name with the reason (for example
// "Store_FrozenIsBoundedByOpTimeout: mem harness cannot freeze the store").
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

	// FreezeStore makes the store stop answering while it keeps its open
	// connections and still accepts new ones, as a server paused by the
	// kernel, a full disk or a stuck GC is (SIGSTOP of the server's
	// processes; internal/testservers knows their PIDs). ThawStore undoes it
	// (SIGCONT); the suite always thaws before the subtest ends. When
	// either is nil the frozen-store subtest is skipped by name.
	FreezeStore func() error
	ThawStore   func() error

	// NewDriverVia opens a driver like NewDriver, but one that reaches each
	// server of the store at the address via(serverAddr) returns instead of
	// serverAddr ("127.0.0.1:port" in, the same form out). The suite's via
	// starts a fault proxy (internal/netproxy) in front of serverAddr, so
	// that it can hold or cut this one client's link while the other
	// clients keep theirs. Every connection the driver makes (pools,
	// listeners, watches) must go through via. When nil the link subtests
	// are skipped by name.
	NewDriverVia func(ctx context.Context, via func(serverAddr string) string) (driver.Driver, error)

	// ResetEndsLease says that a connection reset ends the client's grants
	// on the store by design (PostgreSQL advisory locks live and die with
	// their session; a ZooKeeper client declares its grants lost when its
	// connection drops), so the link subtests expect a lease to be lost,
	// not kept, when its connection is cut. ResetEndsLeaseReason says why,
	// in the subtest's log.
	ResetEndsLease       bool
	ResetEndsLeaseReason string

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

	// NoFreezeReason and NoLinkReason, when set, say why FreezeStore or
	// NewDriverVia is missing (for example "in-process store: no server
	// process to stop, no network link"); the skip message shows it.
	NoFreezeReason string
	NoLinkReason   string
}
