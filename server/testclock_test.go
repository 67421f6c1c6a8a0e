package server_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestServer_TestClockOffsetJumpsTheLeaseClock: a node whose test clock
// offset jumps forward by more than a TTL ends a grant at once, long before
// the holder's own validity ends — the fault dlock verify's
// store-clock-jump injects, and the reason dlockd needs its leader's clock
// to run at the clients' rate (server/doc.go, Clocks). An offset that
// cannot be parsed leaves the clock alone.
func TestServer_TestClockOffsetJumpsTheLeaseClock(t *testing.T) {
	file := filepath.Join(t.TempDir(), "offset")
	if err := os.WriteFile(file, []byte("0s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := start(t, func(c *server.Config) { c.TestClockOffsetFile = file })
	c := grpcClient(t, srv.Addr())
	ctx := t.Context()
	ttl := time.Minute
	g, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000", Ttl: durationpb.New(ttl)})
	if err != nil {
		t.Fatal(err)
	}
	held := func() bool {
		in, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		return in.GetHeld()
	}
	if err := os.WriteFile(file, []byte("not a duration"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if !held() {
		t.Fatal("a malformed offset file ended the grant")
	}
	jumped := time.Now()
	if err := os.WriteFile(file, []byte("2m"), 0o600); err != nil {
		t.Fatal(err)
	}
	for held() {
		if time.Since(jumped) > 10*time.Second {
			t.Fatal("the grant outlived a 2 min jump of the lease clock by 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if since := time.Since(jumped); since >= ttl {
		t.Fatalf("the grant ended %v after the jump: not early", since)
	}
	g2, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-b-0000", Ttl: durationpb.New(ttl)})
	if err != nil || g2.GetFence() <= g.GetFence() {
		t.Fatalf("second grant: %v %v (first fence %d)", g2, err, g.GetFence())
	}
}

func TestServer_TestClockOffsetFileMalformedAtStart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "offset")
	if err := os.WriteFile(file, []byte("soon"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := servertest.Config(t, t.TempDir())
	cfg.TestClockOffsetFile = file
	if _, err := server.New(cfg); err == nil {
		t.Fatal("server.New accepted a malformed clock offset file")
	}
}
