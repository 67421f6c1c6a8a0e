package server_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

// listFixture is a server holding keys inside and outside the ranges of a
// reader that may read "a:" and "c:" (admin on "c:", read on the nested
// "c:x", reduced to "c:"), and a lock-only identity.
type listFixture struct {
	addr             string
	ops, reader, lck string
	readable         []string // every held key the reader may read, in key order
}

func startListFixture(t *testing.T) *listFixture {
	t.Helper()
	dir := t.TempDir()
	ids := []servertest.Identity{
		{Name: "ops", Rules: map[string][]string{"": {"lock", "admin"}}},
		{Name: "reader", Rules: map[string][]string{"a:": {"read"}, "c:": {"admin"}, "c:x": {"read"}}},
		{Name: "locker", Rules: map[string][]string{"": {"lock"}}},
	}
	e := start(t, func(c *server.Config) { c.AuthFile = servertest.WriteAuthFile(t, dir, ids) })
	f := &listFixture{addr: e.Addr(), ops: ids[0].Token, reader: ids[1].Token, lck: ids[2].Token}
	c := grpcClient(t, f.addr)
	for _, k := range []string{"0", "a", "a:1", "a:2", "a;", "b:1", "b:2", "b:3", "c:1", "c:x1", "c:x2", "d", "zz"} {
		if _, err := c.Acquire(withToken(t.Context(), f.ops), acquireReq(k)); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(k, "a:") || strings.HasPrefix(k, "c:") {
			f.readable = append(f.readable, k)
		}
	}
	return f
}

// getJSON GETs path with tok and decodes the JSON answer into out.
func getJSON(t *testing.T, addr, path, tok string, out any) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+path, nil)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 && out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("GET %s: %v in %s", path, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

// checkToken fails unless tok decodes to a key the reader may read.
func (f *listFixture) checkToken(t *testing.T, what, tok string) {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		t.Fatalf("%s: page token %q does not decode: %v", what, tok, err)
	}
	if !slices.Contains(f.readable, string(b)) {
		t.Fatalf("%s: page token names %q, a key the caller may not read (readable: %v)", what, b, f.readable)
	}
}

// TestAuth_ListPageTokensNameOnlyReadableKeys: the reviewer's loop — list
// "" with limit 1 and follow every next_page_token — returns exactly the
// keys the caller may read, over HTTP and gRPC, and every token names one
// of them (a token of the last key scanned used to name unreadable keys,
// enumerating the whole table). A page token naming an unreadable key
// answers the same whether that key exists or not.
func TestAuth_ListPageTokensNameOnlyReadableKeys(t *testing.T) {
	f := startListFixture(t)
	for _, limit := range []int{1, 2, 100} {
		// HTTP
		var got []string
		tok := ""
		for i := 0; ; i++ {
			if i > 50 {
				t.Fatal("HTTP list: more than 50 pages")
			}
			var page struct {
				Holders []struct {
					Key string `json:"key"`
				} `json:"holders"`
				NextPageToken string `json:"next_page_token"`
			}
			path := fmt.Sprintf("/v1/list?prefix=&limit=%d&page_token=%s", limit, url.QueryEscape(tok))
			if code, body := getJSON(t, f.addr, path, f.reader, &page); code != 200 {
				t.Fatalf("GET %s: %d %s", path, code, body)
			}
			for _, h := range page.Holders {
				got = append(got, h.Key)
			}
			if page.NextPageToken == "" {
				break
			}
			f.checkToken(t, "HTTP list", page.NextPageToken)
			tok = page.NextPageToken
		}
		if !slices.Equal(got, f.readable) {
			t.Fatalf("HTTP list, limit %d: %v, want %v", limit, got, f.readable)
		}
		// gRPC
		c := grpcClient(t, f.addr)
		got, tok = nil, ""
		for i := 0; ; i++ {
			if i > 50 {
				t.Fatal("gRPC list: more than 50 pages")
			}
			r, err := c.List(withToken(t.Context(), f.reader), &dlockv1.ListRequest{Limit: uint32(limit), PageToken: tok})
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range r.GetHolders() {
				got = append(got, h.GetKey())
			}
			if r.GetNextPageToken() == "" {
				break
			}
			f.checkToken(t, "gRPC list", r.GetNextPageToken())
			tok = r.GetNextPageToken()
		}
		if !slices.Equal(got, f.readable) {
			t.Fatalf("gRPC list, limit %d: %v, want %v", limit, got, f.readable)
		}
	}
	// A list under a prefix narrower than a rule's, and one that crosses
	// into a rule's range.
	c := grpcClient(t, f.addr)
	for prefix, want := range map[string]string{"c:x": "c:x1,c:x2", "a": "a:1,a:2", "c:": "c:1,c:x1,c:x2"} {
		r, err := c.List(withToken(t.Context(), f.reader), &dlockv1.ListRequest{Prefix: prefix})
		wantCode(t, "reader lists "+prefix, err, codes.OK)
		var ks []string
		for _, h := range r.GetHolders() {
			ks = append(ks, h.GetKey())
		}
		if strings.Join(ks, ",") != want || r.GetNextPageToken() != "" {
			t.Errorf("reader lists %q: %v (next %q), want %s", prefix, ks, r.GetNextPageToken(), want)
		}
	}
	// Probing with a forged token: starting after an unreadable key that
	// exists ("b:2") answers as starting after one that does not ("b:2x").
	probe := func(after string) string {
		r, err := c.List(withToken(t.Context(), f.reader), &dlockv1.ListRequest{Limit: 1, PageToken: base64.RawURLEncoding.EncodeToString([]byte(after))})
		wantCode(t, "list after "+after, err, codes.OK)
		var ks []string
		for _, h := range r.GetHolders() {
			ks = append(ks, h.GetKey())
		}
		return strings.Join(ks, ",") + " next=" + r.GetNextPageToken()
	}
	if a, b := probe("b:2"), probe("b:2x"); a != b {
		t.Errorf("a token naming an existing unreadable key answers %q, a missing one %q: the answer must not tell", a, b)
	}
	if a, b := probe("b:1"), probe("b:0"); a != b {
		t.Errorf("probe b:1 %q != b:0 %q", a, b)
	}
	// A lock-only identity may list nothing; a list's denial names the
	// prefix, not a key.
	_, err := c.List(withToken(t.Context(), f.lck), &dlockv1.ListRequest{Limit: 1})
	wantCode(t, "locker lists", err, codes.PermissionDenied, "read")
	_, err = c.List(withToken(t.Context(), f.reader), &dlockv1.ListRequest{Prefix: "b:"})
	wantCode(t, "reader lists b:", err, codes.PermissionDenied, `identity "reader" lacks read on any key under the prefix "b:"`)
}

// TestUI_LocksPageTokensNameOnlyReadableKeys: the dashboard's key list pages
// only through the keys the caller may read; a lock-only identity sees no
// key, no page token and no totals of the table.
func TestUI_LocksPageTokensNameOnlyReadableKeys(t *testing.T) {
	f := startListFixture(t)
	type page struct {
		Keys []struct {
			Key string `json:"key"`
		} `json:"keys"`
		NextPageToken string `json:"next_page_token"`
		Filtered      bool   `json:"filtered"`
		HeldTotal     *int   `json:"held_total"`
	}
	var got []string
	tok := ""
	for i := 0; ; i++ {
		if i > 50 {
			t.Fatal("more than 50 pages")
		}
		var p page
		path := "/ui/api/locks?prefix=&limit=1&page_token=" + url.QueryEscape(tok)
		if code, body := getJSON(t, f.addr, path, f.reader, &p); code != 200 {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		if !p.Filtered || p.HeldTotal != nil {
			t.Fatalf("reader's page: filtered %v, held_total %v; want filtered and no whole-table totals", p.Filtered, p.HeldTotal)
		}
		for _, k := range p.Keys {
			got = append(got, k.Key)
		}
		if p.NextPageToken == "" {
			break
		}
		f.checkToken(t, "dashboard", p.NextPageToken)
		tok = p.NextPageToken
	}
	if !slices.Equal(got, f.readable) {
		t.Fatalf("dashboard pages: %v, want %v", got, f.readable)
	}
	for _, limit := range []int{1, 50} {
		var p page
		code, body := getJSON(t, f.addr, fmt.Sprintf("/ui/api/locks?prefix=&limit=%d", limit), f.lck, &p)
		if code == 200 && (len(p.Keys) != 0 || p.NextPageToken != "" || p.HeldTotal != nil) {
			t.Fatalf("lock-only identity's dashboard page: %s; want no key, no token, no totals", body)
		}
		if code != 200 && code != 403 {
			t.Fatalf("lock-only identity's dashboard page: %d %s", code, body)
		}
	}
	var p page
	if code, body := getJSON(t, f.addr, "/ui/api/locks?prefix=&limit=5", f.ops, &p); code != 200 || p.HeldTotal == nil || *p.HeldTotal != 13 || len(p.Keys) != 5 || p.Filtered {
		t.Fatalf("ops's dashboard page: %d %s; want 5 keys, held_total 13, not filtered", code, body)
	}
}
