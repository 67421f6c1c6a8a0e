package cli

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/server"
	"github.com/dlock-dev/dlock/server/servertest"
)

// TestCluster_StatusOverTLS: dlock cluster status speaks HTTPS to a
// 3-node cluster whose API serves TLS and requires client certificates,
// with the store URL's ca, cert and key (the same parameters the driver
// dials with); and `dlock run` takes a lock through the same URL. Without
// them, or with a bad file, it fails clearly.
func TestCluster_StatusOverTLS(t *testing.T) {
	peerCA := servertest.NewCA(t, "peer CA")
	apiCA := servertest.NewCA(t, "API CA")
	clients := servertest.NewCA(t, "clients CA")
	var nodes []*testNode
	var peers []server.Peer
	for i := range 3 {
		cfg := servertest.Config(t, t.TempDir())
		cfg.NodeID = fmt.Sprintf("n%d", i+1)
		cfg.Advertise = cfg.Listen
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = testRaftTimeout, testRaftTimeout, testRaftTimeout/2
		cfg.NoSync = true
		p := peerCA.Issue(t, cfg.NodeID)
		cfg.PeerCertFile, cfg.PeerKeyFile, cfg.PeerCAFile = p.CertFile, p.KeyFile, peerCA.CertFile
		a := apiCA.Issue(t, cfg.NodeID+"-api")
		cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSCAFile, cfg.TLSClientCAFile = a.CertFile, a.KeyFile, apiCA.CertFile, clients.CertFile
		nodes = append(nodes, &testNode{cfg: cfg})
		peers = append(peers, server.Peer{ID: cfg.NodeID, RaftAddr: cfg.RaftBind})
	}
	for _, nd := range nodes {
		nd.cfg.InitialCluster = peers
	}
	t.Cleanup(func() {
		for _, nd := range nodes {
			nd.stop()
		}
	})
	for _, nd := range nodes {
		nd.start(t)
	}
	app := clients.Issue(t, "app")
	e := url.QueryEscape
	store := storeOf(nodes) + "?ca=" + e(apiCA.CertFile) + "&cert=" + e(app.CertFile) + "&key=" + e(app.KeyFile)

	st := waitStatus(t, store, func(s *clusterStatus) bool { return len(s.Members) == 3 })
	if st.LeaderID == "" {
		t.Fatalf("no leader in %+v", st)
	}
	code, out, errOut := runCLI(t, "--store", store, "cluster", "status")
	if code != 0 || !strings.Contains(out, st.LeaderID) {
		t.Fatalf("cluster status over https: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "--store", store, "run", "tls:job", "--", "true")
	if code != 0 {
		t.Fatalf("dlock run over TLS: exit %d\n%s%s", code, out, errOut)
	}

	// Plaintext to the TLS cluster: refused, not a hang.
	code, out, errOut = runCLI(t, "--store", storeOf(nodes), "cluster", "status", "--retry-for", "0s", "--timeout", "2s")
	if code == 0 {
		t.Fatalf("plaintext cluster status to a TLS cluster succeeded:\n%s", out)
	}
	if !strings.Contains(errOut, "tls=1") {
		t.Fatalf("plaintext cluster status: %s, want a hint at tls=1", errOut)
	}
	code, _, errOut = runCLI(t, "--store", storeOf(nodes), "run", "--retry-for", "0s", "tls:job", "--", "true")
	if code != ExitUnavailable || !strings.Contains(errOut, "tls=1") {
		t.Fatalf("plaintext dlock run to a TLS cluster: exit %d %s, want 69 with a hint at tls=1", code, errOut)
	}
	// No client certificate: refused in the handshake.
	code, out, errOut = runCLI(t, "--store", storeOf(nodes)+"?ca="+e(apiCA.CertFile), "cluster", "status", "--retry-for", "0s", "--timeout", "2s")
	if code == 0 {
		t.Fatalf("cluster status without a client certificate succeeded:\n%s", out)
	}
	if !strings.Contains(errOut, "cert=FILE") {
		t.Fatalf("cluster status without a client certificate: %s, want a hint at cert=FILE", errOut)
	}
	// A bad file: exit 64 naming the parameter and the file.
	code, _, errOut = runCLI(t, "--store", storeOf(nodes)+"?ca=/nonexistent/ca.pem", "cluster", "status")
	if code != ExitUsage || !strings.Contains(errOut, `ca="/nonexistent/ca.pem"`) {
		t.Fatalf("cluster status with a missing CA file: exit %d %s, want 64 naming the file", code, errOut)
	}
}
