// Package fence is the resource side of fencing: it makes a write to a
// protected resource conditional on the writer's fencing token, so a holder
// whose lease ran out while it was paused (GC, swap, SIGSTOP, a slow
// network) cannot overwrite the work of the holder that came after it.
//
// A lock alone is not a correctness mechanism. A lease says "nobody else
// holds the key until the TTL runs out", but the holder cannot know how long
// it was paused between checking its lease and writing; by the time its
// write lands, a successor may already have written. Every dlock grant
// carries a fence (dlock.Lease.Fence), strictly greater than every fence
// issued earlier for the key; the resource remembers the greatest fence it
// has accepted and refuses anything not greater, answering ErrStaleFence
// (Kleppmann, "How to do distributed locking", 2016; Chubby's sequencers).
//
// # Where the helpers are
//
// This package holds what every resource shares, ErrStaleFence, and
// imports no store client. The helpers for each kind of resource are in
// their own packages, so a program pays only for the client it uses:
//
//   - package fence/fencesql: guarded SQL writes and a per-resource fence
//     table, on database/sql or pgx (it imports neither driver: pgx
//     handles fit its small interfaces);
//   - package fence/fenceredis: a Redis value that only a newer fence can
//     overwrite, with go-redis.
//
// # What the fence does not do
//
// The resource must check every write; a write that bypasses the check is
// not protected. Fences are comparable only between grants of the same lock
// key from the same store (see each driver's documentation for when a store
// can break monotonicity, such as Redis without persistence). For
// resources that cannot store a fence, dlockd can answer whether a fence is
// still the current grant of a key, which is weaker: the answer can be out
// of date when the write lands.
package fence

import "github.com/dlock-dev/dlock/driver"

// ErrStaleFence is dlock.ErrStaleFence (and driver.ErrStaleFence), the
// same value: a resource refused a write because it has already accepted an
// equal or greater fence. The helpers in fence/fencesql and
// fence/fenceredis return errors that wrap it.
var ErrStaleFence = driver.ErrStaleFence
