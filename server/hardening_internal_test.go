package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// startTestServer starts a single node with testConfig and waits until it
// serves writes.
func startTestServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// countdownTTL returns the TTL key's countdown runs with on s.
func countdownTTL(s *Server, key string) (time.Duration, bool) {
	s.clock.mu.Lock()
	defer s.clock.mu.Unlock()
	l := s.clock.byKey.get(key)
	if l == nil || l.delay {
		return 0, false
	}
	return l.ttl, true
}

// TestServer_RewaitIsToldTheTTLItIsGranted: an owner whose queue entry
// outlived its waiting request (the request's cancel failed) and who waits
// again with a longer TTL is granted with the queued entry's TTL; the answer
// must say that TTL, not the one the second request asked for (it did: the
// client was told an hour while the countdown ran for a second, and the key
// went to the next waiter while its holder still believed it valid).
func TestServer_RewaitIsToldTheTTLItIsGranted(t *testing.T) {
	s := startTestServer(t, testConfig(t))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	const holder, waiter = "owner-h-0000", "owner-w-0000"
	if _, err := s.acquire(ctx, acquireIn{key: "k", owner: holder, ttl: time.Hour}, nil, nil); err != nil {
		t.Fatal(err)
	}
	// The waiter's first wait, with a 1 s TTL: its entry is queued, and its
	// request is gone without a cancel (as when the cancel's proposal
	// failed).
	r, err := s.propose(&command{op: opAcquire, key: "k", owner: waiter, ttl: time.Second, wait: true,
		maxWaiters: uint64(s.cfg.MaxWaitersPerKey), maxLeases: uint64(s.cfg.MaxLeases), maxTotalWaiters: uint64(s.cfg.MaxWaiters)})
	if err != nil || r.code != resQueued {
		t.Fatalf("first wait: %+v %v, want queued", r, err)
	}
	type result struct {
		out acquireOut
		err error
	}
	queued := make(chan int, 1)
	done := make(chan result, 1)
	go func() {
		out, err := s.acquire(ctx, acquireIn{key: "k", owner: waiter, ttl: time.Hour, wait: true}, nil, func(pos int) { queued <- pos })
		done <- result{out, err}
	}()
	select {
	case <-queued:
	case res := <-done:
		t.Fatalf("second wait ended before queueing: %+v", res)
	}
	if _, err := s.release("k", holder); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatalf("second wait: %v", res.err)
	}
	ttl, ok := countdownTTL(s, "k")
	if !ok {
		t.Fatal("no countdown for the granted key")
	}
	if res.out.ttl > ttl {
		t.Fatalf("the waiter was told a TTL of %v; its grant's countdown runs for %v", res.out.ttl, ttl)
	}
}

// TestHTTP_GetListFollowsPageToken: GET /v1/list pages with page_token as
// POST does. It ignored the parameter, so a client following
// next_page_token got the first page again, for ever.
func TestHTTP_GetListFollowsPageToken(t *testing.T) {
	s := startTestServer(t, testConfig(t))
	ctx := t.Context()
	want := []string{"p/a", "p/b", "p/c"}
	for _, k := range want {
		if _, err := s.acquire(ctx, acquireIn{key: k, owner: "owner-a-0000", ttl: time.Hour}, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	token := ""
	for page := 0; ; page++ {
		if page > len(want) {
			t.Fatalf("more pages than keys: %v", got)
		}
		u := "http://" + s.Addr() + "/v1/list?prefix=p/&limit=1&page_token=" + url.QueryEscape(token)
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Holders []struct {
				Key string `json:"key"`
			} `json:"holders"`
			NextPageToken string `json:"next_page_token"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v", u, resp.StatusCode, err)
		}
		for _, h := range body.Holders {
			got = append(got, h.Key)
		}
		if body.NextPageToken == "" {
			break
		}
		token = body.NextPageToken
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pages listed %v, want %v", got, want)
	}
}

// TestServer_LongestTTLIsGranted: the longest MaxTTL Validate accepts can
// be granted, and a longer one is refused. Log entries hold durations up to
// 2^62 ns (about 146 years); a MaxTTL of 200 years was accepted, and an
// acquisition asking for it was written to the log, failed to decode when
// applied and was answered INTERNAL.
func TestServer_LongestTTLIsGranted(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxTTL = 200 * 365 * 24 * time.Hour
	if err := cfg.Validate(); err == nil {
		t.Fatalf("MaxTTL %v accepted", cfg.MaxTTL)
	}
	cfg.MaxTTL = maxTTLBound
	s := startTestServer(t, cfg)
	out, err := s.acquire(t.Context(), acquireIn{key: "k", owner: "owner-a-0000", ttl: cfg.MaxTTL}, nil, nil)
	if err != nil || out.ttl != cfg.MaxTTL {
		t.Fatalf("acquire with the longest TTL %v: %+v %v", cfg.MaxTTL, out, err)
	}
	if left, ok := s.clock.remaining("k", out.fence); !ok || left < cfg.MaxTTL-time.Minute {
		t.Fatalf("countdown of the longest TTL: %v left (%v)", left, ok)
	}
	if ok, err := s.renew([]renewIn{{key: "k", owner: "owner-a-0000", ttl: cfg.MaxTTL}}); err != nil || !ok[0] {
		t.Fatalf("renew with the longest TTL: %v %v", ok, err)
	}
}

// brokenFlushWriter is a ResponseWriter whose client is gone: writes are
// buffered, and the flush that would send them fails.
type brokenFlushWriter struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (w *brokenFlushWriter) Header() http.Header         { return w.h }
func (w *brokenFlushWriter) WriteHeader(code int)        { w.status = code }
func (w *brokenFlushWriter) Write(b []byte) (int, error) { return w.body.Write(b) }
func (w *brokenFlushWriter) FlushError() error           { return errors.New("connection reset by peer") }

// TestHTTP_UndeliveredHandoverIsReleasedAtOnce: a grant handed over to an
// HTTP long-poll whose answer cannot be flushed is released at once, not
// after the claim window. The panic-recovery wrapper's Flush swallowed the
// flush error, so the handler never saw it and the key sat with nobody for
// the claim window.
func TestHTTP_UndeliveredHandoverIsReleasedAtOnce(t *testing.T) {
	cfg := testConfig(t)
	cfg.ClaimWindow = time.Hour // only the failed flush can free the key in time
	s := startTestServer(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	const holder, waiter = "owner-h-0000", "owner-w-0000"
	if _, err := s.acquire(ctx, acquireIn{key: "k", owner: holder, ttl: time.Hour}, nil, nil); err != nil {
		t.Fatal(err)
	}
	h := newHTTPHandler(s)
	w := &brokenFlushWriter{h: make(http.Header)}
	req := httptest.NewRequestWithContext(ctx, "POST", "/v1/acquire",
		strings.NewReader(`{"key":"k","owner":"`+waiter+`","ttl":"3600s","wait":true}`))
	done := make(chan struct{})
	go func() { defer close(done); h.ServeHTTP(w, req) }()
	for {
		if v, _ := s.fsm.peek("k", waiter); v.queued {
			break
		}
		select {
		case <-done:
			t.Fatalf("the wait ended before queueing: %d %s", w.status, w.body.String())
		case <-time.After(time.Millisecond):
		}
	}
	if _, err := s.release("k", holder); err != nil {
		t.Fatal(err)
	}
	<-done
	if !strings.Contains(w.body.String(), `"claim_within"`) {
		t.Fatalf("the wait was not answered with a handed-over grant: %d %s", w.status, w.body.String())
	}
	if v, ok := s.fsm.get("k"); ok && v.held {
		t.Fatalf("the undelivered grant is still held by %s", v.grant.owner)
	}
}

// TestServer_CancelledAcquisitionLeavesNothing: an acquisition whose
// caller is gone by the time its entry is applied (a cancelled Session
// call, a dropped connection) answers CANCELLED and leaves neither a grant
// nor a queue entry: nobody would ever release them.
func TestServer_CancelledAcquisitionLeavesNothing(t *testing.T) {
	s := startTestServer(t, testConfig(t))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.acquire(ctx, acquireIn{key: "free", owner: "owner-a-0000", ttl: time.Hour}, nil, nil); err == nil {
		t.Fatal("a cancelled try was granted")
	}
	if v, ok := s.fsm.get("free"); ok {
		t.Fatalf("a cancelled try left %+v", v)
	}
	if _, err := s.acquire(t.Context(), acquireIn{key: "held", owner: "owner-h-0000", ttl: time.Hour}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.acquire(ctx, acquireIn{key: "held", owner: "owner-w-0000", ttl: time.Hour, wait: true}, nil, nil); err == nil {
		t.Fatal("a cancelled wait was granted")
	}
	if v, _ := s.fsm.peek("held", "owner-w-0000"); v.queued || v.waiters != 0 {
		t.Fatalf("a cancelled wait left a queue entry: %+v", v)
	}
}
