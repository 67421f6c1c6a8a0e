package cli

import (
	"context"
	"fmt"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/recipe/semaphore"
)

// nativePermit is the permit index acquire returns for a permit of a
// native semaphore (counted Shared grants of one key), which has no slot.
const nativePermit = -2

// permitLeaseKey returns the key of the lease of permit (a slot index, or
// nativePermit) of the semaphore key.
func permitLeaseKey(key string, permit int) string {
	if permit == nativePermit {
		return semaphore.NativeKey(key)
	}
	return PermitKey(key, permit)
}

// permitKeys names the keys of the semaphore key of n permits on l's
// store, for messages: "KEY/permit-shared" where native, else the range of
// slot keys.
func permitKeys(l *dlock.Locker, key string, n int) string {
	if sem, err := semaphore.New(l, key, n); err == nil && sem.Native() {
		return semaphore.NativeKey(key)
	}
	return fmt.Sprintf("%s .. %s", PermitKey(key, 0), PermitKey(key, n-1))
}

// permitOf returns the permit index run reports for lease: its slot, or
// nativePermit.
func permitOf(sem *semaphore.Semaphore, lease *dlock.Lease) int {
	if sem.Native() {
		return nativePermit
	}
	return sem.Slot(lease)
}

// tryPermits makes one attempt at a permit of the semaphore key (natively
// one request; portably one try of each slot, in random order) and returns
// its lease and permit index; ErrNotAcquired when all are held.
func tryPermits(ctx context.Context, l *dlock.Locker, f *runFlags, key string, opts []dlock.Option) (*dlock.Lease, int, error) {
	sem, err := semaphore.New(l, key, f.permits)
	if err != nil {
		return nil, -1, err
	}
	lease, err := sem.TryAcquire(ctx, opts...)
	if err != nil {
		return nil, -1, err
	}
	return lease, permitOf(sem, lease), nil
}

// waitPermits waits for a permit until one is granted or ctx ends: in the
// store's FIFO queue where the semaphore is native, else by trying the
// slots with full-jitter backoff (semaphore.Semaphore.Acquire).
//
// On portable stores a store that cannot be reached is retried the same
// way when retryOutages is set (--wait without --retry-for: the whole
// wait), and onOutage is told of each such error; otherwise each slot's
// attempt has already spent --retry-for on it. Natively outages are
// retried as a plain --wait retries them (Locker.Acquire, reported to the
// Locker's observer).
func waitPermits(ctx context.Context, l *dlock.Locker, f *runFlags, key string, opts []dlock.Option, retryOutages bool, onOutage func(error)) (*dlock.Lease, int, error) {
	sem, err := semaphore.New(l, key, f.permits, semaphore.WithOutages(retryOutages, onOutage))
	if err != nil {
		return nil, -1, err
	}
	lease, err := sem.Acquire(ctx, opts...)
	if err != nil {
		return nil, -1, err
	}
	return lease, permitOf(sem, lease), nil
}
