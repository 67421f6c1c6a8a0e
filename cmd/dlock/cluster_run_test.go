package main_test

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/server/servertest"
)

// Issue 10: on a 3-node dlockd cluster, kill -9 of the leader neither
// ends the lease of a running `dlock run` (its renewals go to the new
// leader within its TTL) nor makes a waiting `dlock run --wait` exit 69: the
// waiter keeps retrying through the election and runs once the holder is
// done.
func TestRun_ClusterLeaderKilled(t *testing.T) {
	c := servertest.StartCluster(t, 3, servertest.ClusterOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	store := c.URL()

	holder := command(store, "run", "--ttl", "5s", "cluster:key", "--", "sleep", "60")
	var herr bytes.Buffer
	holder.Stderr = &herr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	holderDone := make(chan error, 1)
	go func() { holderDone <- holder.Wait() }()
	defer func() { _ = holder.Process.Kill() }()
	waitHeld(t, store, "cluster:key")

	waiter := command(store, "run", "--wait", "--wait-timeout", "75s", "cluster:key", "--", "echo", "ran")
	var wout, werr bytes.Buffer
	waiter.Stdout, waiter.Stderr = &wout, &werr
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	waiterDone := make(chan error, 1)
	go func() { waiterDone <- waiter.Wait() }()
	defer func() { _ = waiter.Process.Kill() }()
	awaitWaiters(t, store, "cluster:key", 1)

	l, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(l); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(ctx, l); err != nil {
		t.Fatal(err)
	}
	// Two TTLs after the kill the holder still runs: its lease was not lost.
	select {
	case err := <-holderDone:
		t.Fatalf("the holder ended after the leader was killed: %v\nstderr: %s", err, herr.String())
	case err := <-waiterDone:
		t.Fatalf("the waiter ended while the key was held: %v\nstderr: %s", err, werr.String())
	case <-time.After(10 * time.Second):
	}
	_ = holder.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-waiterDone:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("waiter exited %d across the leader's kill, want 0\nstderr: %s", ee.ExitCode(), werr.String())
		}
		if err != nil || strings.TrimSpace(wout.String()) != "ran" {
			t.Fatalf("waiter: %v, stdout %q\nstderr: %s", err, wout.String(), werr.String())
		}
	case <-ctx.Done():
		t.Fatalf("waiter not granted after the holder ended\nstderr: %s", werr.String())
	}
}
