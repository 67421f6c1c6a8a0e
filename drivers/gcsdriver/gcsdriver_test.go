package gcsdriver_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock/dlocktest"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/gcsdriver"
	"github.com/dlock-dev/dlock/internal/testservers/gcsfake"
)

// TestMain checks for leaked goroutines. fake-gcs-server (test only; the
// driver does not import it) links OpenCensus, whose package init starts a
// worker that runs for the life of the process.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

const bucket = "dlock-test"

// TestConformance runs the dlock conformance suite against fake-gcs-server
// (in-process, on a loopback port), each driver opened by URL with its own
// client, as a process would.
func TestConformance(t *testing.T) {
	fake := gcsfake.Start(t, bucket)
	dlocktest.Run(t, dlocktest.Harness{
		Name: "gcs",
		NewDriver: func(ctx context.Context) (driver.Driver, error) {
			return gcsdriver.Open(ctx, fake.URL(bucket, "locks"))
		},
		StopStore:   fake.Stop,
		StartStore:  fake.Start,
		FreezeStore: fake.Freeze,
		ThawStore:   fake.Thaw,
		NewDriverVia: func(ctx context.Context, via func(string) string) (driver.Driver, error) {
			return gcsdriver.Open(ctx, "gs://"+bucket+"/locks?endpoint=http://"+via(fake.Addr()))
		},
		TTL: 500 * time.Millisecond,
	})
}
