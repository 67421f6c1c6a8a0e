package server_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
)

// scrape reads /metrics of the server at addr.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// labelsOf formats a metric's labels as k=v,k=v in name order.
func labelsOf(m *dto.Metric) string {
	var out []string
	for _, lp := range m.GetLabel() {
		out = append(out, lp.GetName()+"="+lp.GetValue())
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// series returns the value of every series of family name, by labelsOf: a
// counter's or gauge's value, a histogram's sample count.
func series(mfs map[string]*dto.MetricFamily, name string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range mfs[name].GetMetric() {
		switch {
		case m.Counter != nil:
			out[labelsOf(m)] = m.GetCounter().GetValue()
		case m.Gauge != nil:
			out[labelsOf(m)] = m.GetGauge().GetValue()
		case m.Histogram != nil:
			out[labelsOf(m)] = float64(m.GetHistogram().GetSampleCount())
		}
	}
	return out
}

// awaitSeries scrapes until every series in want has at least its value.
func awaitSeries(t *testing.T, addr, name string, want map[string]float64) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := series(scrape(t, addr), name)
		missing := ""
		for k, v := range want {
			if got[k] < v {
				missing += fmt.Sprintf(" %s{%s} is %v, want >= %v;", name, k, got[k], v)
			}
		}
		if missing == "" {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s\nall series: %v", missing, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMetrics_RequestsByMethodTransportAndCode calls the server over gRPC,
// HTTP and a Session stream, cancels waits the ways a client does, and
// scrapes /metrics: one method name per RPC for every transport, client
// cancellations counted as Canceled (never Unknown or Internal), durations
// per method, the build and the Raft state.
func TestMetrics_RequestsByMethodTransportAndCode(t *testing.T) {
	srv := start(t, nil)
	addr := srv.Addr()
	c := grpcClient(t, addr)
	ctx := t.Context()
	ttl := durationpb.New(time.Minute)

	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "m", Owner: "owner-a-0123456789", Ttl: ttl}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "m", Ttl: ttl}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("acquire of a held key: %v", err)
	}
	if code, m := post(t, addr, "/v1/acquire", `{"key":"m","ttl":"60s"}`); code != http.StatusConflict {
		t.Fatalf("HTTP acquire of a held key: %d %v", code, m)
	}

	// A Wait stream half-closed by its client, and one whose client
	// cancelled its context.
	wait := func() (dlockv1.Lock_WaitClient, context.CancelFunc) {
		t.Helper()
		wctx, cancel := context.WithCancel(ctx)
		st, err := c.Wait(wctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&dlockv1.AcquireRequest{Key: "m", Ttl: ttl}); err != nil {
			t.Fatal(err)
		}
		if ev, err := st.Recv(); err != nil || ev.GetType() != dlockv1.WaitEvent_QUEUED {
			t.Fatalf("wait: %v %v", ev, err)
		}
		return st, cancel
	}
	st, cancel := wait()
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if ev, err := st.Recv(); err != nil || ev.GetType() != dlockv1.WaitEvent_CANCELLED {
		t.Fatalf("half-closed wait: %v %v", ev, err)
	}
	cancel()
	_, cancel = wait()
	cancel()

	// A unary waiting acquisition the client gave up. (One past its
	// deadline is DeadlineExceeded or Canceled, whichever side's timer
	// fires first.) The cancelled Wait stream's queue entry must be gone
	// first: otherwise its entry passes for the unary call's below, which
	// is then cancelled before the server sees it, and never counted.
	waitFor(t, func() bool {
		r, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "m"})
		return err == nil && r.GetWaiters() == 0
	})
	uctx, ucancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.Acquire(uctx, &dlockv1.AcquireRequest{Key: "m", Ttl: ttl, Wait: true})
		done <- err
	}()
	waitFor(t, func() bool {
		r, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "m"})
		return err == nil && r.GetWaiters() == 1
	})
	ucancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled unary wait: %v", err)
	}

	// A Session call, then the stream's end by the client.
	sctx, scancel := context.WithCancel(ctx)
	ss, err := c.Session(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ss.Send(&dlockv1.SessionRequest{Id: 1, Call: &dlockv1.SessionRequest_Acquire{
		Acquire: &dlockv1.AcquireRequest{Key: "s", Owner: "owner-s-0123456789", Ttl: ttl}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := ss.Recv(); err != nil || r.GetCode() != 0 {
		t.Fatalf("session acquire: %v %v", r, err)
	}
	if err := ss.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := ss.Recv(); err == nil {
		t.Fatal("session stream still open after the client's half-close")
	}
	scancel()

	got := awaitSeries(t, addr, "dlockd_requests_total", map[string]float64{
		"code=OK,method=Acquire,transport=grpc":                 1,
		"code=FailedPrecondition,method=Acquire,transport=grpc": 1,
		"code=FailedPrecondition,method=Acquire,transport=http": 1,
		"code=Canceled,method=Wait,transport=grpc":              2,
		"code=Canceled,method=Acquire,transport=grpc":           1,
		"code=OK,method=Acquire,transport=session":              1,
		"code=OK,method=Session,transport=grpc":                 1,
	})
	for k := range got {
		if strings.Contains(k, "code=Unknown") || strings.Contains(k, "code=Internal") {
			t.Errorf("a client's cancellation counted as a server error: %s", k)
		}
		if strings.Contains(k, "/") || strings.Contains(k, "http:") {
			t.Errorf("method not named by the RPC: %s", k)
		}
	}

	mfs := scrape(t, addr)
	h := series(mfs, "dlockd_request_duration_seconds")
	if h["method=Acquire,transport=grpc"] < 3 || h["method=Wait,transport=grpc"] < 2 {
		t.Errorf("request durations: %v", h)
	}
	if _, ok := h["method=Session,transport=grpc"]; ok {
		t.Errorf("a Session stream's lifetime was timed: %v", h)
	}

	bi := mfs["dlockd_build_info"].GetMetric()
	if len(bi) != 1 || bi[0].GetGauge().GetValue() != 1 {
		t.Fatalf("dlockd_build_info: %v", bi)
	}
	labels := map[string]string{}
	for _, lp := range bi[0].GetLabel() {
		labels[lp.GetName()] = lp.GetValue()
	}
	if labels["go"] != runtime.Version() || labels["version"] == "" {
		t.Errorf("dlockd_build_info labels %v: want go=%s and a version", labels, runtime.Version())
	}
	if _, ok := labels["revision"]; !ok {
		t.Errorf("dlockd_build_info has no revision label: %v", labels)
	}

	state := series(mfs, "dlockd_raft_state")
	want := map[string]float64{"state=leader": 1, "state=follower": 0, "state=candidate": 0, "state=shutdown": 0}
	if fmt.Sprint(state) != fmt.Sprint(want) {
		t.Errorf("dlockd_raft_state = %v, want %v", state, want)
	}
}

// TestMetrics_AppliedIndexAfterSnapshotRestore: a node restarted from a
// snapshot that holds its whole log applies no entry, yet
// dlockd_raft_applied_index says the snapshot's index at once.
func TestMetrics_AppliedIndexAfterSnapshotRestore(t *testing.T) {
	srv := start(t, func(c *server.Config) {
		c.SnapshotInterval = 20 * time.Millisecond
		c.SnapshotThreshold = 1
	})
	c := grpcClient(t, srv.Addr())
	for _, k := range []string{"a", "b", "c"} {
		if _, err := c.Acquire(t.Context(), &dlockv1.AcquireRequest{Key: k, Ttl: durationpb.New(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	applied := series(scrape(t, srv.Addr()), "dlockd_raft_applied_index")[""]
	if applied == 0 {
		t.Fatal("dlockd_raft_applied_index is 0 after three grants")
	}
	// Await a snapshot of everything applied: its directory is
	// TERM-INDEX-MILLIS.
	snapDir := filepath.Join(srv.Cfg.DataDir, "snapshots")
	waitFor(t, func() bool {
		entries, _ := os.ReadDir(snapDir)
		for _, e := range entries {
			parts := strings.Split(e.Name(), "-")
			if e.IsDir() && len(parts) == 3 && !strings.HasSuffix(e.Name(), ".tmp") && parts[1] == fmt.Sprint(applied) {
				return true
			}
		}
		return false
	})
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if got := series(scrape(t, srv.Addr()), "dlockd_raft_applied_index")[""]; got < applied {
		t.Fatalf("after a restore from the snapshot at %v, dlockd_raft_applied_index is %v", applied, got)
	}
	if r, err := grpcClient(t, srv.Addr()).Inspect(t.Context(), &dlockv1.InspectRequest{Key: "b"}); err != nil || !r.GetHeld() {
		t.Fatalf("grant lost across the restore: %v %v", r, err)
	}
}
