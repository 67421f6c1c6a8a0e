package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

// uiGet fetches a dashboard route and decodes its JSON into out (when not
// nil); it returns the status and the raw body.
func uiGet(t *testing.T, addr, path string, out any) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("GET %s: %v in %s", path, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

// uiLocks is the part of /ui/api/locks the tests read.
type uiLocks struct {
	NodeID string `json:"node_id"`
	Keys   []struct {
		Key     string `json:"key"`
		Holder  string `json:"holder"`
		Fence   uint64 `json:"fence"`
		TTLMs   int64  `json:"ttl_ms"`
		AgeMs   *int64 `json:"age_ms"`
		LeftMs  *int64 `json:"left_ms"`
		Waiters int    `json:"waiters"`
		Queue   []struct {
			Position int    `json:"position"`
			Holder   string `json:"holder"`
			WaitedMs *int64 `json:"waited_ms"`
		} `json:"queue"`
	} `json:"keys"`
	NextPageToken string `json:"next_page_token"`
	HeldTotal     int    `json:"held_total"`
	WaitingTotal  int    `json:"waiting_total"`
}

type uiStats struct {
	Source   string            `json:"source"`
	NodeID   string            `json:"node_id"`
	Counters map[string]uint64 `json:"counters"`
	Hold     struct {
		Count uint64 `json:"count"`
	} `json:"hold_seconds"`
	Wait struct {
		Count uint64 `json:"count"`
	} `json:"wait_seconds"`
}

func TestUI_StaticFilesAndRoutes(t *testing.T) {
	e := start(t, nil)
	resp, err := http.Get("http://" + e.Addr() + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `<script src="app.js" defer></script>`) {
		t.Fatalf("GET /ui/: %d %.200s", resp.StatusCode, b)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("CSP %q: want script-src 'self' and no unsafe-inline", csp)
	}
	for path, ctype := range map[string]string{"/ui/app.js": "javascript", "/ui/app.css": "text/css"} {
		resp, err := http.Get("http://" + e.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), ctype) {
			t.Errorf("GET %s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	// The page writes data as text only: no innerHTML in the script.
	js, _ := uiGet(t, e.Addr(), "/ui/app.js", nil)
	if _, body := uiGet(t, e.Addr(), "/ui/app.js", nil); js != 200 || strings.Contains(body, ".innerHTML") || strings.Contains(body, "insertAdjacentHTML") {
		t.Errorf("app.js writes HTML (innerHTML / insertAdjacentHTML)")
	}
	if code, body := uiGet(t, e.Addr(), "/ui/api/nope", nil); code != 404 || !strings.Contains(body, `"code":"NOT_FOUND"`) {
		t.Errorf("GET /ui/api/nope: %d %s", code, body)
	}
	for _, c := range []struct{ path, want string }{
		{"/ui/api/locks?limit=0", "invalid limit"},
		{"/ui/api/locks?limit=100000", "invalid limit"},
		{"/ui/api/locks?page_token=***", "invalid page_token"},
		{"/ui/api/queue", "key"},
		{"/ui/api/queue?key=k&limit=x", "invalid limit"},
	} {
		if code, body := uiGet(t, e.Addr(), c.path, nil); code != 400 || !strings.Contains(body, c.want) {
			t.Errorf("GET %s: %d %s; want 400 naming %q", c.path, code, body, c.want)
		}
	}
}

// TestUI_LocksArePagedInKeyOrder checks the paging of held keys, the prefix
// filter, and that user text comes back as JSON text.
func TestUI_LocksArePagedInKeyOrder(t *testing.T) {
	e := start(t, nil)
	addr := e.Addr()
	for i := range 120 {
		key := fmt.Sprintf("a:%03d", i)
		if i%2 == 1 {
			key = fmt.Sprintf("b:%03d", i)
		}
		if code, m := post(t, addr, "/v1/acquire", fmt.Sprintf(`{"key":%q,"owner":"owner-%03d-xxxxxxxx","holder":"worker %d","ttl":"60s"}`, key, i, i)); code != 200 {
			t.Fatalf("acquire %s: %d %v", key, code, m)
		}
	}
	evil := `<script>alert("x")</script> & 'q'`
	if code, m := post(t, addr, "/v1/acquire", fmt.Sprintf(`{"key":"c:evil","owner":"owner-evil-xxxxxxxx","holder":%q,"ttl":"60s"}`, evil)); code != 200 {
		t.Fatalf("acquire: %d %v", code, m)
	}
	var seen []string
	tok := ""
	for page := 0; ; page++ {
		var d uiLocks
		path := "/ui/api/locks?limit=50"
		if tok != "" {
			path += "&page_token=" + tok
		}
		if code, body := uiGet(t, addr, path, &d); code != 200 {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		if d.HeldTotal != 121 {
			t.Errorf("held_total %d, want 121", d.HeldTotal)
		}
		for _, k := range d.Keys {
			seen = append(seen, k.Key)
			if k.Fence == 0 || k.TTLMs != 60000 || k.AgeMs == nil || k.LeftMs == nil || *k.LeftMs > 60000 || *k.LeftMs < 50000 {
				t.Errorf("key %+v: want a fence, TTL 60 s, an age and time left", k)
			}
		}
		if tok = d.NextPageToken; tok == "" {
			if page != 2 {
				t.Errorf("%d pages, want 3", page+1)
			}
			break
		}
	}
	if len(seen) != 121 {
		t.Fatalf("%d keys over the pages, want 121", len(seen))
	}
	for i := 1; i < len(seen); i++ {
		if seen[i-1] >= seen[i] {
			t.Fatalf("keys out of order at %d: %q then %q", i, seen[i-1], seen[i])
		}
	}
	var d uiLocks
	uiGet(t, addr, "/ui/api/locks?prefix=b:&limit=500", &d)
	if len(d.Keys) != 60 || d.NextPageToken != "" || d.Keys[0].Key != "b:001" {
		t.Errorf("prefix b: %d keys, first %q, next %q; want 60 from b:001, no next page", len(d.Keys), d.Keys[0].Key, d.NextPageToken)
	}
	code, body := uiGet(t, addr, "/ui/api/locks?prefix=c:", &d)
	if code != 200 || len(d.Keys) != 1 || d.Keys[0].Holder != evil {
		t.Fatalf("c:evil: %d %s", code, body)
	}
	if strings.Contains(body, "<script>") {
		t.Errorf("the JSON carries the holder's markup unescaped: %s", body)
	}
}

// TestUI_QueuesWaitTimesAndStats queues two waiters behind a holder over
// HTTP, and checks the queue's order and wait times, the handover after a
// release, and the counters and histograms of /ui/api/stats.
func TestUI_QueuesWaitTimesAndStats(t *testing.T) {
	e := start(t, nil)
	addr := e.Addr()
	if code, m := post(t, addr, "/v1/acquire", `{"key":"q","owner":"holder-xxxxxxxx","holder":"first","ttl":"30s"}`); code != 200 {
		t.Fatalf("acquire: %d %v", code, m)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, name := range []string{"second", "third"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			post(t, addr, "/v1/acquire", fmt.Sprintf(`{"key":"q","owner":"waiter-%d-xxxxxxxx","holder":%q,"ttl":"30s","wait":true}`, i, name))
		}()
		waitFor(t, func() bool {
			var d uiLocks
			uiGet(t, addr, "/ui/api/locks", &d)
			return len(d.Keys) == 1 && d.Keys[0].Waiters == i+1
		})
	}
	time.Sleep(100 * time.Millisecond)
	var q struct {
		Held   bool `json:"held"`
		Holder struct {
			Holder string `json:"holder"`
			Fence  uint64 `json:"fence"`
		} `json:"holder"`
		Waiters int `json:"waiters"`
		Queue   []struct {
			Position int    `json:"position"`
			Holder   string `json:"holder"`
			WaitedMs *int64 `json:"waited_ms"`
		} `json:"queue"`
	}
	if code, body := uiGet(t, addr, "/ui/api/queue?key=q", &q); code != 200 {
		t.Fatalf("queue: %d %s", code, body)
	}
	if !q.Held || q.Holder.Holder != "first" || q.Waiters != 2 || len(q.Queue) != 2 ||
		q.Queue[0].Holder != "second" || q.Queue[1].Holder != "third" || q.Queue[0].Position != 1 ||
		q.Queue[0].WaitedMs == nil || q.Queue[1].WaitedMs == nil || *q.Queue[0].WaitedMs < *q.Queue[1].WaitedMs || *q.Queue[1].WaitedMs < 100 {
		t.Fatalf("queue of q: %+v; want held by first, then second, third, each with its time waited", q)
	}
	first := q.Holder.Fence
	if code, m := post(t, addr, "/v1/release", `{"key":"q","owner":"holder-xxxxxxxx"}`); code != 200 {
		t.Fatalf("release: %d %v", code, m)
	}
	waitFor(t, func() bool {
		uiGet(t, addr, "/ui/api/queue?key=q", &q)
		return q.Held && q.Holder.Holder == "second" && q.Holder.Fence > first && q.Waiters == 1 && q.Queue[0].Holder == "third"
	})
	var s uiStats
	if code, body := uiGet(t, addr, "/ui/api/stats", &s); code != 200 {
		t.Fatalf("stats: %d %s", code, body)
	}
	if s.Source != "leader" || s.Counters["grants"] != 2 || s.Counters["contended"] != 2 || s.Hold.Count != 1 || s.Wait.Count != 1 {
		t.Errorf("stats %+v: want source leader, 2 grants, 2 contended, 1 hold and 1 wait observed", s)
	}
	// The histograms are exported for Prometheus too.
	_, metrics := uiGet(t, addr, "/metrics", nil)
	for _, name := range []string{"dlockd_lease_hold_seconds_count 1", "dlockd_acquire_wait_seconds_count 1", "dlockd_grants_total 2", "dlockd_acquires_contended_total 2", "dlockd_renew_failures_total 0"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %q", name)
		}
	}
	// Hand on to third, so that its wait ends, and release.
	post(t, addr, "/v1/release", `{"key":"q","owner":"waiter-0-xxxxxxxx"}`)
	waitFor(t, func() bool {
		code, _ := post(t, addr, "/v1/release", `{"key":"q","owner":"waiter-1-xxxxxxxx"}`)
		return code == 200
	})
}

// TestUI_FollowerShowsTheLeadersTable: on a follower, the lock table and
// the stats come from the leader; the Raft state is the follower's own.
func TestUI_FollowerShowsTheLeadersTable(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	li := waitLeader(t, nodes, -1)
	leader := nodes[li]
	follower := nodes[(li+1)%3]
	if code, m := post(t, leader.cfg.Listen, "/v1/acquire", `{"key":"f:1","owner":"owner-f1-xxxxxxxx","holder":"on the leader","ttl":"30s"}`); code != 200 {
		t.Fatalf("acquire: %d %v", code, m)
	}
	var c struct {
		NodeID   string `json:"node_id"`
		State    string `json:"state"`
		LeaderID string `json:"leader_id"`
		Term     uint64 `json:"term"`
		Members  []struct {
			ID           string `json:"id"`
			Leader       bool   `json:"leader"`
			AppliedIndex uint64 `json:"applied_index"`
		} `json:"members"`
	}
	// Every member answers the fan-out once it has registered its API
	// address.
	waitFor(t, func() bool {
		if code, body := uiGet(t, follower.cfg.Listen, "/ui/api/cluster", &c); code != 200 {
			t.Fatalf("cluster: %d %s", code, body)
		}
		for _, m := range c.Members {
			if m.AppliedIndex == 0 {
				return false
			}
		}
		return true
	})
	if c.NodeID != follower.cfg.NodeID || c.State != "Follower" || c.LeaderID != leader.cfg.NodeID || c.Term == 0 || len(c.Members) != 3 {
		t.Errorf("cluster on the follower: %+v", c)
	}
	for _, m := range c.Members {
		if m.AppliedIndex == 0 || m.Leader != (m.ID == leader.cfg.NodeID) {
			t.Errorf("member %+v: want its applied index, leader only for %s", m, leader.cfg.NodeID)
		}
	}
	var d uiLocks
	if code, body := uiGet(t, follower.cfg.Listen, "/ui/api/locks", &d); code != 200 {
		t.Fatalf("locks on the follower: %d %s", code, body)
	}
	if d.NodeID != leader.cfg.NodeID || len(d.Keys) != 1 || d.Keys[0].Holder != "on the leader" || d.Keys[0].LeftMs == nil {
		t.Errorf("locks on follower %s: %+v; want the leader %s's table with time left", follower.cfg.NodeID, d, leader.cfg.NodeID)
	}
	var s uiStats
	uiGet(t, follower.cfg.Listen, "/ui/api/stats", &s)
	if s.NodeID != leader.cfg.NodeID || s.Source != "leader" {
		t.Errorf("stats on the follower: node %q source %q; want the leader's", s.NodeID, s.Source)
	}
}

// TestUI_Auth: with an auth file the static files stay public, the JSON
// needs a known token (401), a reader of "a:" sees only a: keys (whatever
// the prefix asked), may not open another prefix's queue (403), and sees
// the members without their addresses.
func TestUI_Auth(t *testing.T) {
	dir := t.TempDir()
	ids := []servertest.Identity{
		{Name: "ops", Rules: map[string][]string{"": {"lock", "admin"}}},
		{Name: "reader-a", Rules: map[string][]string{"a:": {"read"}}},
	}
	e := start(t, func(c *server.Config) { c.AuthFile = servertest.WriteAuthFile(t, dir, ids) })
	addr := e.Addr()
	get := func(path, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, k := range []string{"a:1", "b:1"} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/acquire", strings.NewReader(fmt.Sprintf(`{"key":%q,"owner":"owner-%s-xxxxxxxx","ttl":"30s"}`, k, k)))
		req.Header.Set("Authorization", "Bearer "+ids[0].Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("acquire %s: %d", k, resp.StatusCode)
		}
	}
	if code, _ := get("/ui/", ""); code != 200 {
		t.Errorf("GET /ui/ without a token: %d, want 200 (public)", code)
	}
	for _, p := range []string{"/ui/api/locks", "/ui/api/stats", "/ui/api/cluster", "/ui/api/queue?key=a:1"} {
		if code, body := get(p, ""); code != 401 {
			t.Errorf("GET %s without a token: %d %s, want 401", p, code, body)
		}
		if code, body := get(p, "dlk_unknown"); code != 401 {
			t.Errorf("GET %s with an unknown token: %d %s, want 401", p, code, body)
		}
	}
	for _, prefix := range []string{"", "a:", "b:"} {
		var d uiLocks
		code, body := get("/ui/api/locks?prefix="+prefix, ids[1].Token)
		if code != 200 || json.Unmarshal([]byte(body), &d) != nil {
			t.Fatalf("locks %q as reader-a: %d %s", prefix, code, body)
		}
		want := 1
		if prefix == "b:" {
			want = 0
		}
		if len(d.Keys) != want || (want == 1 && d.Keys[0].Key != "a:1") || !strings.Contains(body, `"filtered":true`) == (prefix != "a:") {
			t.Errorf("locks %q as reader-a: %s; want only a:1, filtered unless the prefix is a:", prefix, body)
		}
	}
	if code, body := get("/ui/api/queue?key=b:1", ids[1].Token); code != 403 || !strings.Contains(body, "PERMISSION_DENIED") {
		t.Errorf("queue of b:1 as reader-a: %d %s, want 403", code, body)
	}
	if code, body := get("/ui/api/queue?key=a:1", ids[1].Token); code != 200 {
		t.Errorf("queue of a:1 as reader-a: %d %s", code, body)
	}
	code, body := get("/ui/api/cluster", ids[1].Token)
	if code != 200 || !strings.Contains(body, `"limited":true`) || strings.Contains(body, "127.0.0.1") {
		t.Errorf("cluster as reader-a: %d %s; want the members without addresses", code, body)
	}
	code, body = get("/ui/api/cluster", ids[0].Token)
	if code != 200 || strings.Contains(body, `"limited"`) || !strings.Contains(body, addr) {
		t.Errorf("cluster as ops: %d %s; want the members with their addresses", code, body)
	}
	if code, _ := get("/ui/api/stats", ids[1].Token); code != 200 {
		t.Errorf("stats as reader-a: %d", code)
	}
}

// TestUI_AgesAfterRestartAreMarked: a grant replayed from the log after a
// restart shows its age as "at least" (the node cannot know it); a grant
// made after the restart does not.
func TestUI_AgesAfterRestartAreMarked(t *testing.T) {
	e := start(t, nil)
	addr := e.Addr()
	if code, m := post(t, addr, "/v1/acquire", `{"key":"old","owner":"owner-old-xxxxxxxx","ttl":"60s"}`); code != 200 {
		t.Fatalf("acquire: %d %v", code, m)
	}
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	if code, m := post(t, addr, "/v1/acquire", `{"key":"new","owner":"owner-new-xxxxxxxx","ttl":"60s"}`); code != 200 {
		t.Fatalf("acquire after the restart: %d %v", code, m)
	}
	var d struct {
		Keys []struct {
			Key        string `json:"key"`
			AgeMs      *int64 `json:"age_ms"`
			AgeAtLeast bool   `json:"age_at_least"`
		} `json:"keys"`
	}
	if code, body := uiGet(t, addr, "/ui/api/locks", &d); code != 200 || len(d.Keys) != 2 {
		t.Fatalf("locks: %d %s", code, body)
	}
	for _, k := range d.Keys {
		if k.AgeMs == nil || k.AgeAtLeast != (k.Key == "old") {
			t.Errorf("key %s: age %v, at least %v; want an age, marked at least only for the grant from before the restart", k.Key, k.AgeMs, k.AgeAtLeast)
		}
	}
}
