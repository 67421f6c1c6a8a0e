package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/server"
)

// Embedding dlockd in a Go program: start a single node on free loopback
// ports, take a lease through the dlockd driver, and shut down.
func Example() {
	dir, err := os.MkdirTemp("", "dlockd-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	cfg := server.DefaultConfig()
	cfg.Listen = "127.0.0.1:0" // any free port; see srv.Addr()
	cfg.RaftBind = "127.0.0.1:0"
	cfg.DataDir = dir
	cfg.RaftLogLevel = "off"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := srv.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitReady(ctx); err != nil {
		fmt.Println(err)
		return
	}

	d, err := dlockddriver.Dial(srv.Addr(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()
	g, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: "payouts", Owner: "0123456789abcdef0123456789abcdef", TTL: 30 * time.Second})
	fmt.Println("granted:", err == nil, "fence > 0:", g.Fence > 0)
	_, err = d.TryAcquire(ctx, driver.AcquireRequest{Key: "payouts", Owner: "fedcba9876543210fedcba9876543210", TTL: 30 * time.Second})
	fmt.Println("second client:", err)
	// Output:
	// granted: true fence > 0: true
	// second client: lock held
}

// Counted permits and read-write locks kept natively in dlockd's state
// machine, through the dlockd driver's SharedView (what recipe/semaphore
// and recipe/rwlock use on dlockd).
func Example_sharedGrants() {
	dir, err := os.MkdirTemp("", "dlockd-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	cfg := server.DefaultConfig()
	cfg.Listen, cfg.RaftBind, cfg.DataDir = "127.0.0.1:0", "127.0.0.1:0", dir
	cfg.RaftLogLevel = "off"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := srv.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitReady(ctx); err != nil {
		fmt.Println(err)
		return
	}
	d, err := dlockddriver.Dial(srv.Addr(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()

	permits, _ := d.SharedView(driver.SharedKind{Mode: driver.Shared, Limit: 2}) // a semaphore of 2
	writer, _ := d.SharedView(driver.SharedKind{Mode: driver.Exclusive})
	req := func(owner string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: "exports", Owner: owner, TTL: 30 * time.Second}
	}
	a, _ := permits.TryAcquire(ctx, req("permit-a-0123456789abcdef"))
	b, _ := permits.TryAcquire(ctx, req("permit-b-0123456789abcdef"))
	fmt.Println("two permits, fences increasing:", b.Fence > a.Fence)
	_, err = permits.TryAcquire(ctx, req("permit-c-0123456789abcdef"))
	fmt.Println("third permit:", err)
	_, err = writer.TryAcquire(ctx, req("writer-0123456789abcdef"))
	fmt.Println("exclusive grant:", err)
	_ = permits.Release(ctx, "exports", "permit-a-0123456789abcdef")
	_, err = permits.TryAcquire(ctx, req("permit-c-0123456789abcdef"))
	fmt.Println("third permit after a release:", err == nil)
	// Output:
	// two permits, fences increasing: true
	// third permit: lock held
	// exclusive grant: lock held
	// third permit after a release: true
}
