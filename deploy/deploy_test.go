// Package deploy_test checks the files under deploy/ against the real code:
// the Prometheus alert rules (promtool check rules and test rules), the
// Grafana dashboard (valid JSON, one datasource input, every metric it
// queries exported by dlockd or package metrics), the systemd unit
// (systemd-analyze verify), and the example 3-node TLS cluster of
// examples/cluster-tls run with the unit's command line (the issue's "Done
// when"). Every metric name the rules and the dashboard use is checked
// against a real dlockd cluster's /metrics and a metrics.Collector after
// lock traffic, so renaming a metric breaks this test, not an operator's
// alert.
package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/dlock-dev/dlock"
	_ "github.com/dlock-dev/dlock/drivers/dlockddriver" // dlockd:// URLs
	"github.com/dlock-dev/dlock/metrics"
	"github.com/dlock-dev/dlock/server/servertest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	servertest.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// needTool returns the path of a program the test needs, or fails the test
// with how to install it: a missing tool is a failure, never a skip.
func needTool(t *testing.T, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found in PATH: %s (scripts/install-test-deps.sh installs the test tools)", name, hint)
	}
	return p
}

// TestAlerts_Promtool runs promtool check rules on alerts.yaml and promtool
// test rules on alerts_test.yaml (a firing and a quiet case per alert), and
// checks every alert has severity, summary, description and runbook, and
// a test.
func TestAlerts_Promtool(t *testing.T) {
	promtool := needTool(t, "promtool", "install Debian's prometheus package: apt-get install prometheus")
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		} else if !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %s says no SUCCESS:\n%s", strings.Join(args, " "), out)
		}
	}

	// Every alert documented, and tested.
	rules := readFile(t, "prometheus/alerts.yaml")
	tests := readFile(t, "prometheus/alerts_test.yaml")
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\S+)`).FindAllStringSubmatch(rules, -1)
	if len(alerts) < 6 {
		t.Fatalf("%d alerts in alerts.yaml, want at least the issue's 6", len(alerts))
	}
	blocks := regexp.MustCompile(`(?m)^\s*- alert: `).Split(rules, -1)[1:]
	for i, a := range alerts {
		name := a[1]
		for _, want := range []string{"severity:", "summary:", "description:", "runbook:"} {
			if !strings.Contains(blocks[i], want) {
				t.Errorf("alert %s lacks %s", name, strings.TrimSuffix(want, ":"))
			}
		}
		if n := strings.Count(tests, "alertname: "+name+"\n"); n < 2 {
			t.Errorf("alert %s has %d evaluations in alerts_test.yaml, want a firing and a quiet one", name, n)
		}
	}
	for _, want := range []string{"dlock_leases_lost_total", "dlock_hold_ttl_ratio", `dlock_renewals_total{result="error"}`,
		"dlock_acquire_duration_seconds", "dlockd_raft_has_leader", "dlockd_cluster_member_lag_entries"} {
		if !strings.Contains(rules, want) {
			t.Errorf("alerts.yaml uses no %s (an alert of the issue)", want)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Inputs []struct {
		Name, Type, PluginID string
	} `json:"__inputs"`
	Title      string
	Templating struct {
		List []struct {
			Name       string
			Datasource map[string]string
			Query      any
		}
	}
	Panels []panel
}

type panel struct {
	ID         int
	Type       string
	Title      string
	Datasource map[string]string
	GridPos    struct{ H, W, X, Y int }
	Targets    []struct {
		Expr       string
		Datasource map[string]string
	}
}

// TestDashboard_JSON: deploy/grafana/dlock.json is valid JSON, takes its
// datasource as the ${DS_PROMETHEUS} input on every panel, query and
// variable, filters client panels by the store template variable, lays
// panels out without overlap, and starts with the lock-health row that
// pairs a user-facing, a saturation and a correctness metric.
func TestDashboard_JSON(t *testing.T) {
	raw := readFile(t, "grafana/dlock.json")
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(raw))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("grafana/dlock.json: %v", err)
	}
	if len(d.Inputs) != 1 || d.Inputs[0].Name != "DS_PROMETHEUS" || d.Inputs[0].Type != "datasource" || d.Inputs[0].PluginID != "prometheus" {
		t.Errorf("__inputs %+v: want one prometheus datasource input DS_PROMETHEUS", d.Inputs)
	}
	const ds = "${DS_PROMETHEUS}"
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Datasource["uid"] != ds {
			t.Errorf("variable %s: datasource %v, want uid %s", v.Name, v.Datasource, ds)
		}
	}
	if !vars["store"] || !vars["instance"] {
		t.Errorf("template variables %v: want store (client metrics) and instance (dlockd)", vars)
	}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	var firstRow []panel
	rows := 0
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if g := p.GridPos; g.W < 1 || g.X < 0 || g.X+g.W > 24 || g.H < 1 {
			t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, g)
		}
		for x := p.GridPos.X; x < p.GridPos.X+p.GridPos.W; x++ {
			for y := p.GridPos.Y; y < p.GridPos.Y+p.GridPos.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Fatalf("panels %q and %q overlap at %d,%d", other, p.Title, x, y)
				}
				taken[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			rows++
			continue
		}
		if rows == 1 {
			firstRow = append(firstRow, p)
		}
		if p.Datasource["uid"] != ds {
			t.Errorf("panel %q: datasource %v, want uid %s", p.Title, p.Datasource, ds)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if q.Datasource["uid"] != ds {
				t.Errorf("panel %q: query datasource %v, want uid %s", p.Title, q.Datasource, ds)
			}
			if strings.Contains(q.Expr, "dlock_") && !strings.Contains(q.Expr, `store=~"$store"`) {
				t.Errorf("panel %q: client query %s is not filtered by $store", p.Title, q.Expr)
			}
		}
	}
	// The named dashboard: user-facing, saturation, correctness.
	var first []string
	for _, p := range firstRow {
		for _, q := range p.Targets {
			first = append(first, q.Expr)
		}
	}
	all := strings.Join(first, "\n")
	for _, want := range []string{"dlock_acquire_duration_seconds_bucket", "dlockd_waiters", "dlockd_limit_refusals_total", "dlock_leases_lost_total"} {
		if !strings.Contains(all, want) {
			t.Errorf("the first row (lock health) does not query %s", want)
		}
	}
	for _, want := range []string{"dlockd_raft_is_leader", "dlockd_raft_term", "dlockd_raft_applied_index", "dlockd_held_leases",
		"dlockd_waiters", "dlockd_limit_refusals_total", "dlockd_requests_total", "dlockd_request_duration_seconds_bucket",
		"dlockd_leases_expired_total", "dlockd_force_releases_total", "dlockd_lease_hold_seconds_bucket", "dlockd_acquire_wait_seconds_bucket"} {
		if !strings.Contains(raw, want) {
			t.Errorf("the dashboard does not query %s", want)
		}
	}
}

// unitPath is the systemd unit; unitConfig the config path in its
// ExecStart.
const (
	unitPath   = "systemd/dlockd.service"
	unitConfig = "/etc/dlockd/dlockd.yaml"
	unitBinary = "/usr/local/bin/dlockd"
)

// unitExecStart returns the unit's ExecStart command line, split on
// blanks.
func unitExecStart(t *testing.T) []string {
	t.Helper()
	var line string
	sc := bufio.NewScanner(strings.NewReader(readFile(t, unitPath)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "ExecStart="); ok {
			if line != "" {
				t.Fatalf("%s: two ExecStart lines", unitPath)
			}
			line = v
		}
	}
	if line == "" {
		t.Fatalf("%s: no ExecStart", unitPath)
	}
	return strings.Fields(line)
}

// TestSystemdUnit_Verify: the unit runs dlockd --config
// /etc/dlockd/dlockd.yaml with the hardening options the issue names, and
// systemd-analyze verify finds nothing to say about it (with ExecStart's
// binary pointed at a real dlockd, since verify checks it exists).
func TestSystemdUnit_Verify(t *testing.T) {
	analyze := needTool(t, "systemd-analyze", "install Debian's systemd package: apt-get install systemd")
	if got := unitExecStart(t); !slices.Equal(got, []string{unitBinary, "--config", unitConfig}) {
		t.Errorf("ExecStart %q, want %s --config %s", got, unitBinary, unitConfig)
	}
	unit := readFile(t, unitPath)
	for _, want := range []string{
		"Type=exec", "User=dlockd", "StateDirectory=dlockd", "ExecReload=/bin/kill -HUP $MAINPID",
		"NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "PrivateDevices=yes",
		"ReadWritePaths=/var/lib/dlockd", "CapabilityBoundingSet=\n", "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
		"SystemCallFilter=@system-service", "LimitNOFILE=",
	} {
		if !strings.Contains(unit, want) {
			t.Errorf("%s lacks %q", unitPath, strings.TrimSpace(want))
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "dlockd.service")
	if err := os.WriteFile(path, []byte(strings.Replace(unit, "ExecStart="+unitBinary, "ExecStart="+servertest.Binary(t), 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(analyze, "verify", path)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0")
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unitPath, err, out)
	}
}

// metricRef matches a dlock or dlockd metric name in rules, tests and
// dashboard queries.
var metricRef = regexp.MustCompile(`\bdlockd?_[a-z0-9_]+`)

// TestMetricNames_ExistInCode: every dlock_* and dlockd_* name in
// alerts.yaml, alerts_test.yaml and the dashboard is a metric that a real
// dlockd cluster (3 processes, scraped on /metrics after lock traffic) or
// a metrics.Collector (after the same traffic through the dlockd driver)
// exports; a histogram's _bucket, _sum and _count count as its name.
func TestMetricNames_ExistInCode(t *testing.T) {
	// --max-wait-streams 1: the second waiter is refused, so the limit
	// refusal counter has a series.
	c := servertest.StartCluster(t, 3, servertest.ClusterOptions{Args: []string{"--max-wait-streams", "1"}})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	col := metrics.NewCollector()
	lockTraffic(t, ctx, c, leader, col)
	families := collectorFamilies(t, col)
	// The leader exports the member series once every member answers.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, ok := scrape(t, ctx, c, leader)["dlockd_cluster_member_lag_entries"]; ok || time.Now().After(deadline) {
			break
		}
	}
	for i := range c.N() {
		for name, mf := range scrape(t, ctx, c, i) {
			families[name] = mf.GetType()
		}
	}

	used := map[string][]string{}
	for _, f := range []string{"prometheus/alerts.yaml", "prometheus/alerts_test.yaml", "grafana/dlock.json"} {
		for _, name := range metricRef.FindAllString(readFile(t, f), -1) {
			if !slices.Contains(used[name], f) {
				used[name] = append(used[name], f)
			}
		}
	}
	if len(used) < 20 {
		t.Fatalf("only %d metric names found in the rules and the dashboard", len(used))
	}
	var missing []string
	for name, files := range used {
		if exists(families, name) {
			continue
		}
		missing = append(missing, fmt.Sprintf("%s (in %s)", name, strings.Join(files, ", ")))
	}
	sort.Strings(missing)
	t.Logf("%d metric names of the rules and the dashboard checked against %d exported families", len(used), len(families))
	if len(missing) > 0 {
		var have []string
		for n := range families {
			if strings.HasPrefix(n, "dlock") {
				have = append(have, n)
			}
		}
		sort.Strings(have)
		t.Errorf("metric names no code exports:\n  %s\nexported: %s", strings.Join(missing, "\n  "), strings.Join(have, " "))
	}
}

// exists reports whether name is an exported family, or a histogram's
// (summary's) _bucket, _sum or _count series.
func exists(families map[string]dto.MetricType, name string) bool {
	if _, ok := families[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		switch families[base] {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			return true
		case dto.MetricType_SUMMARY:
			return suffix != "_bucket"
		}
	}
	return false
}

// scrape returns node i's /metrics families.
func scrape(t *testing.T, ctx context.Context, c *servertest.Cluster, i int) map[string]*dto.MetricFamily {
	t.Helper()
	body, code, err := c.Do(ctx, i, http.MethodGet, "/metrics", nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("scrape %s: HTTP %d %v", c.Node(i).ID, code, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("scrape %s: %v", c.Node(i).ID, err)
	}
	return mfs
}

// lockTraffic makes every metric of the dashboard and the rules appear:
// grants, contention, a queue wait that is granted, a waiter refused by the
// wait-stream limit, renewals, a release, a force release (admin, audited)
// that costs a holder its lease, all through the dlockd driver observed by
// col.
func lockTraffic(t *testing.T, ctx context.Context, c *servertest.Cluster, leader int, col *metrics.Collector) {
	t.Helper()
	open := func(keyClass string) *dlock.Locker {
		l, err := dlock.Open(ctx, c.URL(), dlock.WithStoreName("dlockd"), dlock.WithKeyClass(keyClass), dlock.WithObserver(col))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	a, b := open("a"), open("b")
	opts := []dlock.Option{dlock.WithTTL(time.Second), dlock.WithHeartbeat(100 * time.Millisecond)}

	held, err := a.Acquire(ctx, "m:held", opts...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "m:held", opts...); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("try of a held key: %v", err)
	}
	// Two waiters: one Wait stream is allowed, the other refused.
	var wg sync.WaitGroup
	results := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			ls, err := b.Acquire(wctx, "m:held", opts...)
			if err == nil {
				err = ls.Release(ctx)
			}
			results[i] = err
		}()
	}
	time.Sleep(500 * time.Millisecond) // renewals; the waiters queue
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("waiters: %v", results)

	// A force release by the operator: the holder loses its lease.
	victim, err := a.Acquire(ctx, "m:forced", opts...)
	if err != nil {
		t.Fatal(err)
	}
	body, code, err := c.Do(ctx, leader, http.MethodPost, "/v1/force-release", map[string]any{"key": "m:forced", "reason": "deploy test"})
	if err != nil || code != http.StatusOK {
		t.Fatalf("force release: HTTP %d %v %s", code, err, body)
	}
	select {
	case <-victim.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the force-released lease was not lost within 10s")
	}
	// The lease's context (and Done) is cancelled first, so that the
	// holder stops at once; its observer hears of the loss just after.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok := collectorFamilies(t, col)["dlock_leases_lost_total"]; ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the collector counted no lost lease within 5 s of the loss")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// collectorFamilies returns the metric families col exports, by name,
// gathered through a pedantic registry.
func collectorFamilies(t *testing.T, col *metrics.Collector) map[string]dto.MetricType {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	families := make(map[string]dto.MetricType, len(mfs))
	for _, mf := range mfs {
		families[mf.GetName()] = mf.GetType()
	}
	return families
}
