package election_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-dev/dlock"
	_ "github.com/dlock-dev/dlock/drivers/memdriver" // mem://
	"github.com/dlock-dev/dlock/recipe/election"
)

// Campaign until leader, work under the leadership's context with its term
// as the fence, resign when done.
func Example() {
	ctx := context.Background()
	locker, err := dlock.Open(ctx, "mem://election-example") // or dlockd://, etcd://, zk://, redis://, ...
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	lead, err := election.Campaign(ctx, locker, "billing-scheduler", "host-3", dlock.WithTTL(15*time.Second))
	if err != nil {
		panic(err)
	}
	defer lead.Resign(context.Background())

	// Work under lead.Context(): it is cancelled the moment leadership can
	// no longer be trusted (at the latest at the lease's deadline). Pass
	// lead.Term() to what the leader writes; it only grows.
	fmt.Println("leader:", lead.Value(), "term > 0:", lead.Term() > 0, "err:", lead.Err())
	// Output: leader: host-3 term > 0: true err: <nil>
}

// Leader tells anyone who leads now, with the term to expect on its writes.
func ExampleLeader() {
	ctx := context.Background()
	node1, _ := dlock.Open(ctx, "mem://election-leader")
	node2, _ := dlock.Open(ctx, "mem://election-leader")
	defer node1.Close()
	defer node2.Close()

	_, err := election.Leader(ctx, node2, "reindex")
	fmt.Println(errors.Is(err, election.ErrNoLeader))

	lead, _ := election.Campaign(ctx, node1, "reindex", "node-1")
	cur, _ := election.Leader(ctx, node2, "reindex")
	fmt.Println(cur.Value, cur.Term == lead.Term())

	_ = lead.Resign(ctx)
	_, err = election.Leader(ctx, node2, "reindex")
	fmt.Println(errors.Is(err, election.ErrNoLeader))
	// Output:
	// true
	// node-1 true
	// true
}

// Observe follows the election: the current leader first, then each new
// one; the zero LeaderInfo means nobody leads.
func ExampleObserve() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node1, _ := dlock.Open(ctx, "mem://election-observe")
	watcher, _ := dlock.Open(ctx, "mem://election-observe")
	defer node1.Close()
	defer watcher.Close()

	leaders, err := election.Observe(ctx, watcher, "scheduler", election.WithPollInterval(20*time.Millisecond))
	if err != nil {
		panic(err)
	}
	show := func(l election.LeaderInfo) {
		if l.Term == 0 {
			fmt.Println("no leader")
			return
		}
		fmt.Println("leader:", l.Value)
	}
	show(<-leaders) // nobody yet

	lead, _ := election.Campaign(ctx, node1, "scheduler", "node-1")
	show(<-leaders)
	_ = lead.Resign(ctx)
	show(<-leaders)
	// Output:
	// no leader
	// leader: node-1
	// no leader
}

// Losing leadership ends its context with dlock.ErrLeaseLost: the leader
// stops acting at once. Here the Locker is closed under it instead
// (dlock.ErrClosed), which ends leadership the same way.
func ExampleLeadership_Context() {
	ctx := context.Background()
	locker, _ := dlock.Open(ctx, "mem://election-context")
	lead, _ := election.Campaign(ctx, locker, "compactor", "node-1")

	work := func(ctx context.Context) error {
		<-ctx.Done() // a leader's loop would check ctx between steps
		return context.Cause(ctx)
	}
	go locker.Close()
	err := work(lead.Context())
	fmt.Println(errors.Is(err, dlock.ErrClosed), errors.Is(lead.Err(), dlock.ErrClosed))
	// Output: true true
}
