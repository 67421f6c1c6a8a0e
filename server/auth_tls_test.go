package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

// certClient returns a Lock client over TLS trusting ca and presenting
// leaves.
func certClient(t *testing.T, addr string, ca *servertest.CA, leaves ...*servertest.Leaf) dlockv1.LockClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(ca.ClientTLS(leaves...))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return dlockv1.NewLockClient(cc)
}

// TestAuth_CertificateIdentities: with mutual TLS, a client certificate
// maps to an identity by subject CN or DNS SAN and gets its rules; a
// certificate no identity lists is UNAUTHENTICATED; an expired or
// untrusted certificate is refused at the handshake; a member's
// certificate (the peer CA) may do everything, or act for the identity it
// names; a client cannot name one. Over gRPC and HTTPS; a Reload that
// drops a CN revokes it.
func TestAuth_CertificateIdentities(t *testing.T) {
	apiCA := servertest.NewCA(t, "API CA")
	clients := servertest.NewCA(t, "clients CA")
	peers := servertest.NewCA(t, "peer CA")
	rogue := servertest.NewCA(t, "rogue CA")
	dir := t.TempDir()
	ids := []servertest.Identity{
		{Name: "alice", Token: "-", CertCN: []string{"alice"}, Rules: map[string][]string{"payout:": {"lock"}}},
		{Name: "bob", Token: "-", CertDNS: []string{"bob.internal"}, Rules: map[string][]string{"payout:": {"read"}}},
	}
	authFile := servertest.WriteAuthFile(t, dir, ids)
	srvLeaf := apiCA.Issue(t, "dlockd")
	node := peers.Issue(t, "dlockd-1")
	e := start(t, func(c *server.Config) {
		c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile = srvLeaf.CertFile, srvLeaf.KeyFile, clients.CertFile
		c.PeerCertFile, c.PeerKeyFile, c.PeerCAFile = node.CertFile, node.KeyFile, peers.CertFile
		c.AuthFile = authFile
		c.AuditLogFile = filepath.Join(dir, "audit.log")
	})
	ctx := t.Context()
	alice := certClient(t, e.Addr(), apiCA, clients.Issue(t, "alice"))
	bob := certClient(t, e.Addr(), apiCA, clients.IssueWith(t, "bob-laptop", servertest.LeafOptions{DNSNames: []string{"bob.internal"}, ClientOnly: true}))
	mallory := certClient(t, e.Addr(), apiCA, clients.Issue(t, "mallory"))
	expired := certClient(t, e.Addr(), apiCA, clients.IssueWith(t, "alice", servertest.LeafOptions{NotAfter: time.Now().Add(-time.Minute), ClientOnly: true}))
	untrusted := certClient(t, e.Addr(), apiCA, rogue.Issue(t, "alice"))
	// A member: a peer CA certificate naming a node ID of the Raft
	// configuration (this node's, dlockd-1).
	member := certClient(t, e.Addr(), apiCA, peers.Issue(t, "dlockd-1"))

	_, err := alice.Acquire(ctx, acquireReq("payout:1"))
	wantCode(t, "alice on payout:1", err, codes.OK)
	_, err = alice.Acquire(ctx, acquireReq("settle:1"))
	wantCode(t, "alice on settle:1", err, codes.PermissionDenied, `"alice"`, `"settle:1"`, "lock")
	_, err = bob.Inspect(ctx, &dlockv1.InspectRequest{Key: "payout:1"})
	wantCode(t, "bob (DNS SAN) inspects", err, codes.OK)
	_, err = bob.Acquire(ctx, acquireReq("payout:2"))
	wantCode(t, "bob acquires", err, codes.PermissionDenied, `"bob"`, "lock")
	_, err = mallory.Acquire(ctx, acquireReq("payout:3"))
	wantCode(t, "mallory (unlisted CN)", err, codes.Unauthenticated, `"mallory"`)
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = expired.Acquire(tctx, acquireReq("payout:4"))
	cancel()
	wantCode(t, "expired certificate", err, codes.Unavailable)
	// A Go client does not send a certificate of a CA the server does not
	// name: the call comes without one (A2: client certificates are
	// required per call, not in the handshake).
	_, err = untrusted.Acquire(ctx, acquireReq("payout:4"))
	wantCode(t, "untrusted certificate", err, codes.Unauthenticated, "client certificate is required")
	// A client naming an identity is not believed: alice stays alice.
	_, err = alice.Acquire(metadata.AppendToOutgoingContext(ctx, "dlock-identity", "root"), acquireReq("settle:2"))
	wantCode(t, "alice naming root", err, codes.PermissionDenied, `"alice"`)
	// A member may do everything, or act for a named identity.
	_, err = member.ForceRelease(ctx, &dlockv1.ForceReleaseRequest{Key: "payout:1", Reason: "member"})
	wantCode(t, "member force-releases", err, codes.OK)
	_, err = member.Acquire(metadata.AppendToOutgoingContext(ctx, "dlock-identity", "bob"), acquireReq("payout:5"))
	wantCode(t, "member acting for bob", err, codes.PermissionDenied, `"bob"`)
	_, err = member.Acquire(metadata.AppendToOutgoingContext(ctx, "dlock-identity", "nobody-known"), acquireReq("payout:5"))
	wantCode(t, "member acting for an unknown identity", err, codes.Unauthenticated, "nobody-known")

	// HTTPS with alice's certificate.
	hc := httpsClient(t, apiCA, clients.Issue(t, "alice"))
	for _, c := range []struct {
		key  string
		want int
	}{{"payout:h", 200}, {"settle:h", 403}} {
		code, m := postJSON(t, hc, "https://"+e.Addr()+"/v1/acquire", `{"key":"`+c.key+`","owner":"owner-http-0123456789","ttl":"30s"}`)
		if code != c.want {
			t.Fatalf("HTTPS alice on %s: %d %v, want %d", c.key, code, m, c.want)
		}
	}

	// A Reload without alice's CN: her open connection is refused.
	ids[0].CertCN = []string{"alice-old"}
	servertest.WriteAuthFile(t, dir, ids)
	if err := e.Server().Reload(); err != nil {
		t.Fatal(err)
	}
	_, err = alice.Acquire(ctx, acquireReq("payout:6"))
	wantCode(t, "alice after her CN was dropped", err, codes.Unauthenticated)
}

// TestAuth_ClusterForwardsIdentity: on a 3-node cluster with peer TLS, API
// TLS and an auth file, a follower checks a call before it forwards it,
// and the leader applies the caller's rules, for a token (forwarded with
// the call) and a certificate identity (named by the forwarding member),
// over gRPC and HTTPS; the audit line of a forwarded force release names
// the caller, not the member, and the member that forwarded it ("via").
func TestAuth_ClusterForwardsIdentity(t *testing.T) {
	peerCA := servertest.NewCA(t, "peer CA")
	apiCA := servertest.NewCA(t, "API CA")
	clients := servertest.NewCA(t, "clients CA")
	dir := t.TempDir()
	ids := []servertest.Identity{
		{Name: "worker", Rules: map[string][]string{"payout:": {"lock"}}},
		{Name: "ops", Token: "-", CertCN: []string{"ops"}, Rules: map[string][]string{"": {"admin", "lock"}}},
	}
	authFile := servertest.WriteAuthFile(t, dir, ids)
	nodes := startCluster(t, 3, func(i int, c *server.Config) {
		p := peerCA.Issue(t, c.NodeID)
		c.PeerCertFile, c.PeerKeyFile, c.PeerCAFile = p.CertFile, p.KeyFile, peerCA.CertFile
		a := apiCA.Issue(t, c.NodeID+"-api")
		c.TLSCertFile, c.TLSKeyFile, c.TLSCAFile = a.CertFile, a.KeyFile, apiCA.CertFile
		c.TLSClientCAFile = clients.CertFile
		c.AuthFile = authFile
		c.AuditLogFile = filepath.Join(dir, c.NodeID+"-audit.log")
	})
	l := waitLeader(t, nodes, -1)
	waitUntil(t, "every member registered its API", func() bool { return registered(nodes, 3) })
	f := (l + 1) % 3
	follower := nodes[f].cfg.Listen
	app := clients.Issue(t, "app") // a client certificate no identity lists: the token says who
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	worker := certClient(t, follower, apiCA, app)
	wctx := withToken(ctx, ids[0].Token)
	_, err := worker.Acquire(wctx, acquireReq("payout:f1"))
	wantCode(t, "worker through the follower", err, codes.OK)
	_, err = worker.Acquire(wctx, acquireReq("settle:f1"))
	wantCode(t, "worker on settle through the follower", err, codes.PermissionDenied, `"worker"`, "lock")
	ops := certClient(t, follower, apiCA, clients.Issue(t, "ops"))
	_, err = ops.ForceRelease(ctx, &dlockv1.ForceReleaseRequest{Key: "payout:f1", Reason: "forwarded"})
	wantCode(t, "ops force-releases through the follower", err, codes.OK)
	// The follower denied settle:f1 itself (before forwarding); the
	// leader wrote the force release, naming ops.
	waitAudit(t, nodes[f].cfg.AuditLogFile, func(ls []map[string]any) bool {
		for _, l := range ls {
			if l["key"] == "settle:f1" && l["identity"] == "worker" && l["result"] == "PERMISSION_DENIED" {
				return true
			}
		}
		return false
	})
	waitAudit(t, nodes[l].cfg.AuditLogFile, func(ls []map[string]any) bool {
		for _, l := range ls {
			if l["action"] == "force-release" && l["identity"] == "ops" && l["result"] == "ok" && l["via"] == nodes[f].cfg.NodeID {
				return true
			}
		}
		return false
	})

	// HTTPS through the follower, with the token and with ops's certificate.
	req := func(c *http.Client, tok, path, body string) int {
		t.Helper()
		r, err := http.NewRequestWithContext(ctx, "POST", "https://"+follower+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Content-Type", "application/json")
		if tok != "" {
			r.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := c.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return resp.StatusCode
	}
	appHTTP := httpsClient(t, apiCA, app)
	if code := req(appHTTP, ids[0].Token, "/v1/acquire", `{"key":"payout:f2","owner":"owner-f2-0123456789","ttl":"30s"}`); code != 200 {
		t.Fatalf("HTTPS worker through the follower: %d", code)
	}
	if code := req(appHTTP, ids[0].Token, "/v1/acquire", `{"key":"settle:f2","owner":"owner-f2-0123456789","ttl":"30s"}`); code != 403 {
		t.Fatalf("HTTPS worker on settle through the follower: %d", code)
	}
	if code := req(appHTTP, "", "/v1/acquire", `{"key":"payout:f3","owner":"owner-f3-0123456789","ttl":"30s"}`); code != 401 {
		t.Fatalf("HTTPS without a token (unlisted certificate): %d", code)
	}
	opsHTTP := httpsClient(t, apiCA, clients.Issue(t, "ops"))
	if code := req(opsHTTP, "", "/v1/force-release", `{"key":"payout:f2","reason":"forwarded over HTTPS"}`); code != 200 {
		t.Fatalf("HTTPS ops force release through the follower: %d", code)
	}
	if code := req(appHTTP, ids[0].Token, "/v1/cluster/remove", `{"id":"n9"}`); code != 403 {
		t.Fatalf("worker's cluster remove: %d", code)
	}
	waitAudit(t, nodes[l].cfg.AuditLogFile, func(ls []map[string]any) bool {
		for _, l := range ls {
			if l["action"] == "force-release" && l["identity"] == "ops" && l["key"] == "payout:f2" && l["via"] == nodes[f].cfg.NodeID {
				return true
			}
		}
		return false
	})
}
