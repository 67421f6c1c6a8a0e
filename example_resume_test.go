package dlock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-dev/dlock"
)

// A restarted process re-attaches to the lease its previous run held: the
// token is saved after the grant and resumed on start; the fence is the
// same, so the resource sees no new holder.
func ExampleLocker_Resume() {
	ctx := context.Background()
	run1, _ := dlock.Open(ctx, "mem://example-resume")
	defer run1.Close() // (a killed process closes nothing: here, for the leak check)
	lease, _ := run1.Acquire(ctx, "nightly-settlement", dlock.WithTTL(30*time.Second))
	saved, _ := json.Marshal(lease.Token()) // e.g. to a 0600 file

	// ... the process is killed; the store still holds the grant ...
	run2, _ := dlock.Open(ctx, "mem://example-resume")
	defer run2.Close()
	var tok dlock.LeaseToken
	if err := json.Unmarshal(saved, &tok); err != nil {
		panic(err)
	}
	resumed, err := run2.Resume(ctx, tok)
	if err != nil {
		panic(err) // ErrLeaseLost: it expired meanwhile; acquire afresh
	}
	fmt.Println("same fence:", resumed.Fence() == lease.Fence())
	_ = resumed.Release(ctx)

	_, err = run2.Resume(ctx, tok)
	fmt.Println("after release:", errors.Is(err, dlock.ErrLeaseLost))
	// Output:
	// same fence: true
	// after release: true
}

// WithMaxHold bounds a hold: renewals stop at the bound and the lease's
// context ends with ErrMaxHoldReached, so a stuck job loses its lease at a
// known time.
func ExampleWithMaxHold() {
	ctx := context.Background()
	locker, _ := dlock.Open(ctx, "mem://example-maxhold")
	defer locker.Close()
	lease, _ := locker.Acquire(ctx, "report", dlock.WithTTL(time.Second), dlock.WithMaxHold(200*time.Millisecond))

	<-lease.Context().Done() // the job ran too long
	cause := context.Cause(lease.Context())
	fmt.Println(errors.Is(cause, dlock.ErrMaxHoldReached), errors.Is(cause, dlock.ErrLeaseLost))
	fmt.Println(errors.Is(lease.Release(ctx), dlock.ErrMaxHoldReached))
	// Output:
	// true true
	// true
}
