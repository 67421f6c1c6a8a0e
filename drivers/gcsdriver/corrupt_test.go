package gcsdriver_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/testservers/gcsfake"
)

// TestDriver_CorruptRecordIsPermanent: a record whose metadata the driver
// did not write (a fence or TTL that does not parse, a fence of 0), or
// whose fence cannot advance (2^64 − 1), is refused with
// ErrInvalidArgument by every call that reads it, directly and through
// the root package: a permanent fault of the store's data, never
// ErrUnavailable (WithFailOpen would run the job unlocked on it). The
// record is never overwritten.
func TestDriver_CorruptRecordIsPermanent(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	d := open(t, fake)
	l := dlock.New(d)
	t.Cleanup(func() { _ = l.Close() })
	for _, tc := range []struct {
		name string
		meta map[string]string
		free bool // a valid free record: only a grant (its next fence) fails
	}{
		{"FenceNotANumber", map[string]string{"dlock-fence": "seven"}, false},
		{"FenceZero", map[string]string{"dlock-fence": "0"}, false},
		{"FenceCannotAdvance", map[string]string{"dlock-fence": strconv.FormatUint(1<<64-1, 10)}, true},
		{"HeldTTLNotANumber", map[string]string{"dlock-fence": "3", "dlock-owner": ownerB, "dlock-ttl-us": "ten seconds"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "corrupt-" + tc.name
			tc.meta["dlock-key"] = key
			tc.meta["dlock-version"] = "0123456789abcdef"
			fake.Fake().CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: bucket, Name: "locks/" + key, Metadata: tc.meta}})
			before := record(t, fake, key).Generation
			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) {
					t.Errorf("%s = %v; want ErrInvalidArgument (a permanent fault), not ErrUnavailable", what, err)
				}
			}
			g, err := d.TryAcquire(t.Context(), req(key, ownerA, time.Minute))
			check("TryAcquire", err)
			if err == nil {
				t.Errorf("TryAcquire granted fence %d over a corrupt record", g.Fence)
			}
			if !tc.free {
				_, err = d.Inspect(t.Context(), key)
				check("Inspect", err)
				_, err = d.ForceRelease(t.Context(), key, "test")
				check("ForceRelease", err)
				check("Renew", d.Renew(t.Context(), key, ownerB, time.Minute))
				check("Release", d.Release(t.Context(), key, ownerB))
				_, err = d.Resume(t.Context(), req(key, ownerB, time.Minute), 3)
				check("Resume", err)
			}
			_, err = l.TryAcquire(t.Context(), key)
			if !errors.Is(err, dlock.ErrInvalidArgument) || errors.Is(err, dlock.ErrUnavailable) {
				t.Errorf("Locker.TryAcquire = %v; want ErrInvalidArgument, not ErrUnavailable", err)
			}
			if after := record(t, fake, key).Generation; after != before {
				t.Errorf("the corrupt record was rewritten (generation %d, was %d)", after, before)
			}
		})
	}
}
