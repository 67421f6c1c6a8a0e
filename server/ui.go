package server

// ui.go owns the live dashboard at /ui/ on the API port: its static files
// (server/ui/, embedded with go:embed: no build step, nothing fetched from
// outside) and the JSON it polls, under /ui/api/. It reads the lock table
// (fsm.list, fsm.queue), the lease clock (ages, time left), the queue-entry
// times (waittimes.go), the counters and histograms of lockmetrics.go and
// metrics.go, and the cluster's status (clusterStatus); it changes nothing.
//
// # Routes
//
//   - GET /ui/ (index.html), /ui/app.js, /ui/app.css: public, they hold no
//     data. Served with a Content-Security-Policy that allows only this
//     origin's scripts and styles (no inline script).
//   - GET /ui/api/locks?prefix=P&limit=N&page_token=T: one page of held
//     keys starting with P, in key order, from the lock table's ordered
//     index (the cost is the page's, never the table's), each with its
//     holder text, fence, TTL, age, time left, queue length and the head of
//     its queue. limit: 1 to uiMaxLimit (default uiDefaultLimit).
//   - GET /ui/api/queue?key=K&limit=N: K's queue, head first (up to
//     uiMaxQueue entries), each with its holder text, TTL and time waited.
//   - GET /ui/api/stats: the cumulative counters the page turns into rates
//     (grants, contention, expiries, renewal failures, force releases,
//     unclaimed handovers, lock-delays), the held and waiting gauges, and
//     the hold-time and wait-time histograms.
//   - GET /ui/api/cluster: the Raft state as this node sees it (the members
//     with their state, term, applied index and last contact, as
//     clusterStatus fans out), answered by this node even without a leader.
//
// # On a follower
//
// locks, queue and stats are the leader's: a node that is not the leader
// forwards them to it (as the /v1/ routes are forwarded, with the caller's
// Authorization), because only the leader's lease clock knows the time
// left of a grant (renewals move the leader's countdown alone). With no
// leader to forward to, locks and queue answer 503 NOT_LEADER and stats
// answers this node's own numbers ("source": "local"). Every answer names
// the node that produced it (node_id), so the page says "leader n1 via n2".
//
// # Authorisation
//
// The JSON needs read permission (auth.go). locks scans only the key
// ranges under the prefix that the caller may read (readRanges), so that
// a token that may read "a:" sees the a: keys of any prefix and never an
// error for the others, and its page tokens never name a key it may not
// read (an identity that may read nothing there gets an empty page, and
// the whole table's totals only with read on ""); a caller with no (or an
// unknown) token gets 401, and the page asks for a token. queue needs read on its key (authorize,
// audited on denial). stats needs an authenticated caller: it holds the
// numbers /metrics publishes. cluster too, and read on "" for the members'
// addresses (as /v1/cluster/status). Holder texts and keys are user data:
// the page writes them as text (textContent), never as HTML.

import (
	"embed"
	"encoding/base64"
	"encoding/json"
	"io/fs"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
)

//go:embed ui
var uiFiles embed.FS

// Page sizes of the dashboard's JSON.
const (
	uiDefaultLimit = 50   // keys per page of /ui/api/locks by default
	uiMaxLimit     = 500  // most keys per page
	uiQueueHead    = 5    // queue entries shown with each key of a page
	uiMaxQueue     = 1000 // most entries of one /ui/api/queue answer
)

// uiCSP is the Content-Security-Policy of the dashboard's files: this
// origin's scripts, styles and JSON only; no inline script, no frames.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// uiRoutes registers the dashboard's routes on mux.
func uiRoutes(s *Server, mux *http.ServeMux) {
	u := &uiAPI{s: s, fw: newHTTPForwarder(s, mux)}
	static, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree always has ui/
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(static))
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET /ui/", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", uiCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /ui/api/locks", u.leaderRead(u.locks))
	mux.HandleFunc("GET /ui/api/queue", u.leaderRead(u.queue))
	mux.HandleFunc("GET /ui/api/stats", u.leaderRead(u.stats))
	mux.HandleFunc("GET /ui/api/cluster", u.cluster)
	mux.HandleFunc("GET /ui/api/", func(w http.ResponseWriter, r *http.Request) {
		uiError(w, apiErr(codes.NotFound, ReasonInvalidRequest, "no dashboard route %s %s (GET /ui/api/locks, /ui/api/queue, /ui/api/stats, /ui/api/cluster)", r.Method, r.URL.Path))
	})
}

// uiAPI serves the dashboard's JSON.
type uiAPI struct {
	s  *Server
	fw *httpForwarder
}

// leaderRead serves h on the leader, and forwards the request to the leader
// from any other node (once: a forwarded request is served here, and h
// answers NOT_LEADER if this node cannot). With no leader to forward to, h
// runs here.
func (u *uiAPI) leaderRead(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if u.s.ready.Load() || r.Header.Get(HeaderForwarded) != "" {
			h(w, r)
			return
		}
		// The caller's credentials are checked here too, so that nothing
		// is forwarded for a caller this node refuses.
		if err := u.s.authenticated(r.Context()); err != nil {
			uiError(w, err)
			return
		}
		if api := u.s.forwardTo(); api != "" {
			u.fw.forward(w, r, api)
			return
		}
		h(w, r)
	}
}

// uiHolder is one held key of /ui/api/locks.
type uiHolder struct {
	Key    string `json:"key"`
	Holder string `json:"holder"`
	Fence  uint64 `json:"fence"`
	TTLMs  int64  `json:"ttl_ms"`
	// AgeMs is how long ago the serving node applied the grant (or
	// restored it); LeftMs the time left on its countdown; nil when the
	// node has no countdown for it (a grant just made or ended).
	AgeMs  *int64 `json:"age_ms"`
	LeftMs *int64 `json:"left_ms"`
	// AgeAtLeast: the grant came from a snapshot (a restart or a restore),
	// so it is older than AgeMs.
	AgeAtLeast bool      `json:"age_at_least,omitempty"`
	Waiters    int       `json:"waiters"`
	Queue      []uiWaitr `json:"queue"` // the head of the queue, up to uiQueueHead
	// A key with Shared grants (shared.go): the fields above describe its
	// oldest live grant; Holders counts them, Limit is the key's permit
	// limit (0: any number).
	Shared  bool `json:"shared,omitempty"`
	Holders int  `json:"holders,omitempty"`
	Limit   int  `json:"limit,omitempty"`
}

// uiWaitr is one queue entry. The owner token is never shown: it is the
// capability to release the grant.
type uiWaitr struct {
	Position int    `json:"position"`
	Holder   string `json:"holder"`
	TTLMs    int64  `json:"ttl_ms"`
	// WaitedMs is how long ago the serving node applied the queue entry;
	// with AtLeast, the entry came from a snapshot and waits since before
	// that; nil when unknown.
	WaitedMs *int64 `json:"waited_ms"`
	AtLeast  bool   `json:"at_least,omitempty"`
}

// uiLocks is the answer of /ui/api/locks.
type uiLocks struct {
	NodeID string     `json:"node_id"`
	Prefix string     `json:"prefix"`
	Keys   []uiHolder `json:"keys"`
	// NextPageToken names the next page ("" after the last).
	NextPageToken string `json:"next_page_token"`
	// Filtered: the caller may not read every key under the prefix; keys
	// it may not read are left out.
	Filtered bool `json:"filtered"`
	// HeldTotal and WaitingTotal count the whole table (every prefix);
	// only for a caller that may read every key (read on ""), absent
	// otherwise.
	HeldTotal    *int `json:"held_total,omitempty"`
	WaitingTotal *int `json:"waiting_total,omitempty"`
}

func (u *uiAPI) locks(w http.ResponseWriter, r *http.Request) {
	s, ctx, q := u.s, r.Context(), r.URL.Query()
	prefix := q.Get("prefix")
	if len(prefix) > s.cfg.MaxKeyBytes || !utf8.ValidString(prefix) {
		uiError(w, apiErr(codes.InvalidArgument, ReasonInvalidKey, "invalid prefix: more than %d bytes or not UTF-8", s.cfg.MaxKeyBytes))
		return
	}
	limit, err := uiLimit(q.Get("limit"), uiDefaultLimit, min(uiMaxLimit, s.cfg.MaxListLimit))
	if err != nil {
		uiError(w, err)
		return
	}
	after, err := decodePageToken(q.Get("page_token"), s.cfg.MaxKeyBytes)
	if err != nil {
		uiError(w, err)
		return
	}
	filter := false
	if !s.allowed(ctx, PermRead, prefix) {
		if err := s.authenticated(ctx); err != nil {
			uiError(w, err)
			return
		}
		filter = true
	}
	if err := s.readBarrier(); err != nil {
		uiError(w, err)
		return
	}
	out := uiLocks{NodeID: s.cfg.NodeID, Prefix: prefix, Keys: []uiHolder{}, Filtered: filter}
	if s.allowed(ctx, PermRead, "") {
		held, waiting := s.fsm.counts()
		out.HeldTotal, out.WaitingTotal = &held, &waiting
	}
	// Only the ranges the caller may read are scanned (none for an
	// identity that may read nothing under the prefix: an empty page), so
	// the page and its token name readable keys alone.
	vs, more := s.fsm.listIn(s.readRanges(ctx, prefix), after, limit)
	for _, v := range vs {
		out.Keys = append(out.Keys, u.holder(v))
	}
	if more && len(vs) > 0 {
		out.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(vs[len(vs)-1].key))
	}
	uiJSON(w, out)
}

// holder describes one held key, with the head of its queue.
func (u *uiAPI) holder(v holderView) uiHolder {
	h := uiHolder{Key: v.key, Holder: v.grant.holder(), Fence: v.grant.fence, TTLMs: v.grant.ttl.Milliseconds(), Waiters: v.waiters, Shared: v.shared, Holders: v.holders, Limit: v.limit}
	if age, left, restored, ok := u.s.clock.held(v.key, v.grant.owner, v.grant.fence); ok {
		a, l := age.Milliseconds(), left.Milliseconds()
		h.AgeMs, h.LeftMs, h.AgeAtLeast = &a, &l, restored
	}
	if v.waiters > 0 {
		h.Queue, h.Waiters = u.queueOf(v.key, uiQueueHead)
	}
	return h
}

// queueOf describes up to limit of key's queue entries and returns the
// queue's length.
func (u *uiAPI) queueOf(key string, limit int) ([]uiWaitr, int) {
	ws, n := u.s.fsm.queue(key, limit)
	now := time.Now()
	out := make([]uiWaitr, len(ws))
	for i, wt := range ws {
		out[i] = uiWaitr{Position: i + 1, Holder: wt.holder(), TTLMs: wt.ttl.Milliseconds()}
		if st, ok := u.s.waitTimes.since(key, wt.owner); ok {
			d := now.Sub(st.at).Milliseconds()
			out[i].WaitedMs, out[i].AtLeast = &d, st.restored
		}
	}
	return out, n
}

// uiQueue is the answer of /ui/api/queue.
type uiQueue struct {
	NodeID  string    `json:"node_id"`
	Key     string    `json:"key"`
	Held    bool      `json:"held"`
	Holder  *uiHolder `json:"holder"` // nil when not held
	Waiters int       `json:"waiters"`
	Queue   []uiWaitr `json:"queue"`
}

func (u *uiAPI) queue(w http.ResponseWriter, r *http.Request) {
	s, q := u.s, r.URL.Query()
	key := q.Get("key")
	if err := s.checkKey(key); err != nil {
		uiError(w, err)
		return
	}
	limit, err := uiLimit(q.Get("limit"), uiMaxQueue, uiMaxQueue)
	if err != nil {
		uiError(w, err)
		return
	}
	if err := s.authorize(r.Context(), PermRead, key); err != nil {
		uiError(w, err)
		return
	}
	if err := s.readBarrier(); err != nil {
		uiError(w, err)
		return
	}
	out := uiQueue{NodeID: s.cfg.NodeID, Key: key, Queue: []uiWaitr{}}
	if v, ok := s.fsm.get(key); ok && v.held {
		h := u.holder(v)
		h.Queue = nil
		out.Held, out.Holder = true, &h
	}
	out.Queue, out.Waiters = u.queueOf(key, limit)
	uiJSON(w, out)
}

// uiHistogram is a histogram's cumulative buckets, as Prometheus exposes
// them.
type uiHistogram struct {
	Count   uint64     `json:"count"`
	Sum     float64    `json:"sum"`
	Buckets []uiBucket `json:"buckets"`
}

type uiBucket struct {
	LE    float64 `json:"le"`    // upper bound, seconds
	Count uint64  `json:"count"` // observations <= LE, cumulative
}

// uiStats is the answer of /ui/api/stats. The counters are cumulative since
// the serving node started; the page turns the differences between polls
// into rates.
type uiStats struct {
	NodeID string `json:"node_id"`
	// Source is "leader", or "local" when no leader could answer and this
	// node answered with its own numbers.
	Source   string            `json:"source"`
	TimeMs   int64             `json:"time_ms"` // the serving node's clock, Unix milliseconds
	Held     int               `json:"held"`
	Waiting  int               `json:"waiting"`
	Counters map[string]uint64 `json:"counters"`
	Hold     uiHistogram       `json:"hold_seconds"`
	Wait     uiHistogram       `json:"wait_seconds"`
}

func (u *uiAPI) stats(w http.ResponseWriter, r *http.Request) {
	s := u.s
	if err := s.authenticated(r.Context()); err != nil {
		uiError(w, err)
		return
	}
	out := uiStats{NodeID: s.cfg.NodeID, Source: "leader", TimeMs: time.Now().UnixMilli()}
	if !s.ready.Load() {
		out.Source = "local"
	}
	out.Held, out.Waiting = s.fsm.counts()
	lm := s.lockMetrics
	out.Counters = map[string]uint64{
		"grants":         counterValue(lm.grants),
		"contended":      counterValue(lm.contended),
		"expired":        counterValue(s.metrics.expired),
		"renew_failures": counterValue(lm.renewFailures),
		"force_releases": counterValue(lm.forceReleased),
		"unclaimed":      counterValue(lm.unclaimed),
		"lock_delays":    counterValue(lm.lockDelays),
	}
	out.Hold = histogramValue(lm.holdSeconds)
	out.Wait = histogramValue(lm.waitSeconds)
	uiJSON(w, out)
}

// counterValue reads a counter (counted in whole events).
func counterValue(c prometheus.Counter) uint64 {
	var m dto.Metric
	if c.Write(&m) != nil {
		return 0
	}
	return uint64(m.GetCounter().GetValue())
}

// histogramValue reads a histogram's cumulative buckets.
func histogramValue(h prometheus.Histogram) uiHistogram {
	var m dto.Metric
	out := uiHistogram{Buckets: []uiBucket{}}
	if h.Write(&m) != nil {
		return out
	}
	hm := m.GetHistogram()
	out.Count, out.Sum = hm.GetSampleCount(), hm.GetSampleSum()
	for _, b := range hm.GetBucket() {
		out.Buckets = append(out.Buckets, uiBucket{LE: b.GetUpperBound(), Count: b.GetCumulativeCount()})
	}
	return out
}

// uiMember is one member of /ui/api/cluster.
type uiMember struct {
	ID           string `json:"id"`
	APIAddr      string `json:"api_addr"`
	RaftAddr     string `json:"raft_addr"`
	Voter        bool   `json:"voter"`
	Leader       bool   `json:"leader"`
	State        string `json:"state"`
	Term         uint64 `json:"term"`
	AppliedIndex uint64 `json:"applied_index"`
	// LastContactMs: how long ago the member last heard from the leader
	// (0 for the leader); nil when unknown.
	LastContactMs *int64 `json:"last_contact_ms"`
	Error         string `json:"error,omitempty"`
}

// uiCluster is the answer of /ui/api/cluster.
type uiCluster struct {
	NodeID    string     `json:"node_id"`
	State     string     `json:"state"` // this node's Raft state
	LeaderID  string     `json:"leader_id"`
	LeaderAPI string     `json:"leader_api"`
	Term      uint64     `json:"term"`
	Members   []uiMember `json:"members"`
	// Limited: the caller may not read the prefix "", so the members'
	// addresses (and errors, which name them) are left out.
	Limited bool `json:"limited,omitempty"`
}

func (u *uiAPI) cluster(w http.ResponseWriter, r *http.Request) {
	s := u.s
	if err := s.authenticated(r.Context()); err != nil {
		uiError(w, err)
		return
	}
	// The cluster's status needs read on "" (as /v1/cluster/status): a
	// caller that may read only some keys sees the members' states without
	// their addresses.
	limited := !s.allowed(r.Context(), PermRead, "")
	st, err := s.clusterStatus(r.Context(), false)
	if err != nil {
		if st, err = s.clusterStatus(r.Context(), true); err != nil {
			uiError(w, err)
			return
		}
	}
	out := uiCluster{NodeID: s.cfg.NodeID, State: s.raft.State().String(), LeaderID: st.GetLeaderId(), LeaderAPI: st.GetLeaderApi(), Term: st.GetTerm(), Members: []uiMember{}, Limited: limited}
	if s.removed.Load() {
		out.State = "Removed"
	}
	if limited {
		out.LeaderAPI = ""
	}
	for _, m := range st.GetMembers() {
		um := uiMember{ID: m.GetId(), APIAddr: m.GetApiAddr(), RaftAddr: m.GetRaftAddr(), Voter: m.GetVoter(), Leader: m.GetLeader(), State: m.GetState(), Term: m.GetTerm(), AppliedIndex: m.GetAppliedIndex(), Error: m.GetError()}
		if lc := m.GetLastContact(); lc != nil {
			ms := lc.AsDuration().Milliseconds()
			um.LastContactMs = &ms
		}
		if limited {
			um.APIAddr, um.RaftAddr = "", ""
			if um.Error != "" {
				um.Error = "unreachable"
			}
		}
		out.Members = append(out.Members, um)
	}
	uiJSON(w, out)
}

// uiLimit parses a limit parameter: def when empty, else 1 to max.
func uiLimit(v string, def, max int) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > max {
		return 0, apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid limit %q: want 1 to %d", v, max)
	}
	return n, nil
}

// uiJSON writes v as the JSON answer, never cached.
func uiJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		uiError(w, apiErr(codes.Internal, ReasonInternal, "encode: %v", err))
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(append(b, '\n'))
}

// uiError writes err as the JSON API does ({"code","reason","message"},
// with the HTTP status of its code), never cached.
func uiError(w http.ResponseWriter, err error) {
	w.Header().Set("Cache-Control", "no-store")
	_ = writeReply(w, nil, err)
}
