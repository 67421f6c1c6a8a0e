package dynamodbdriver

import "testing"

// SetEpochBits makes each fence epoch hold 2^bits − 1 grants for the rest
// of t (the default, 24 bits, is too many to exhaust in a test).
func SetEpochBits(t testing.TB, bits uint) {
	old := epochBits
	epochBits = bits
	t.Cleanup(func() { epochBits = old })
}

// EpochBits is the number of low fence bits that count grants in an epoch.
func EpochBits() uint { return epochBits }

// EpochKey is the key of the table's fence epoch counter item.
var EpochKey = epochKey

// Observations returns the number of keys the driver has seen held.
func (d *Driver) Observations() int { return d.seen.len() }
