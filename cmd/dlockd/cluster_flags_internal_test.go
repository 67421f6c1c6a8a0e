package main

import (
	"strings"
	"testing"
)

// TestRun_ClusterFlags: the cluster flags reach server.Config (each
// invalid combination is refused by Validate with its own message, exit
// status 2), and --help lists them but not the test-only dial rewrite.
func TestRun_ClusterFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--node-id", "n1", "--initial-cluster", "n2=127.0.0.1:7461,n3=127.0.0.1:7471"}, "does not include this node"},
		{[]string{"--initial-cluster", "n1"}, "want id=host:port"},
		{[]string{"--node-id", "n1", "--initial-cluster", "n1=127.0.0.1:7451", "--join", "127.0.0.1:7460"}, "exclusive"},
		{[]string{"--join", "nope"}, "Join \"nope\""},
		{[]string{"--advertise", "0.0.0.0:7450"}, "Advertise \"0.0.0.0:7450\""},
		{[]string{"--peer-cert", "c.pem"}, "all three"},
		{[]string{"--peer-cert", "c.pem", "--peer-key", "k.pem"}, "all three"},
		{[]string{"--raft-bind", "0.0.0.0:7451", "--raft-advertise", "10.0.0.1:7451"}, "mutual TLS"},
		{[]string{"--test-raft-dial-rewrite", "a=127.0.0.1:1"}, "RaftDialRewrite key \"a\""},
		{[]string{"--test-raft-dial-rewrite", "a"}, "want from-host:port=to-host:port"},
		// Ports outside 1..65535 (0 only for --listen and --raft-bind).
		{[]string{"--node-id", "n1", "--initial-cluster", "n1=127.0.0.1:7451,n2=127.0.0.1:99999"}, "port 99999 is outside 1..65535"},
		{[]string{"--join", "127.0.0.1:99999"}, "Join \"127.0.0.1:99999\": port 99999 is outside 1..65535"},
		{[]string{"--advertise", "127.0.0.1:99999"}, "Advertise \"127.0.0.1:99999\": port 99999"},
		{[]string{"--raft-advertise", "127.0.0.1:99999"}, "RaftAdvertise \"127.0.0.1:99999\": port 99999"},
		{[]string{"--listen", "127.0.0.1:99999"}, "Listen \"127.0.0.1:99999\": port 99999"},
		{[]string{"--raft-bind", "127.0.0.1:99999"}, "RaftBind \"127.0.0.1:99999\": port 99999"},
		{[]string{"--listen", ":7450"}, "host is empty"},
		// --raft-bind is the address others dial unless --raft-advertise.
		{[]string{"--node-id", "n1", "--raft-bind", "127.0.0.1:7452", "--initial-cluster", "n1=127.0.0.1:7451,n2=127.0.0.1:7461"}, "RaftBind is 127.0.0.1:7452 and RaftAdvertise is not set"},
		// Node IDs that --initial-cluster and dlock cluster remove can name.
		{[]string{"--node-id", "a b=c,d"}, "node ID \"a b=c,d\""},
	}
	for _, tc := range cases {
		var out, errOut strings.Builder
		if code := run(tc.args, &out, &errOut); code != 2 {
			t.Errorf("dlockd %v: exit %d, want 2 (stderr %q)", tc.args, code, errOut.String())
			continue
		}
		if !strings.Contains(errOut.String(), tc.want) || strings.Count(errOut.String(), "\n") != 1 {
			t.Errorf("dlockd %v: stderr %q, want one line with %q", tc.args, errOut.String(), tc.want)
		}
	}
	var out, errOut strings.Builder
	if code := run([]string{"--help"}, &out, &errOut); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, f := range []string{"--advertise", "--initial-cluster", "--join", "--peer-cert", "--peer-key", "--peer-ca"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("--help does not list %s", f)
		}
	}
	help := out.String()
	if strings.Contains(help, "(default: --raft-bind)") || !strings.Contains(help, "this node's entry there") {
		t.Error("--help: --raft-advertise does not say its default with --initial-cluster")
	}
	for _, f := range []string{"peer-cert", "peer-key", "peer-ca"} {
		i := strings.Index(help, "--"+f+" string")
		if line, _, _ := strings.Cut(help[i:], "\n"); !strings.Contains(line, "required") || !strings.Contains(line, "not a loopback address") {
			t.Errorf("--help: --%s does not say it is required off loopback: %q", f, line)
		}
	}
	if !strings.Contains(help, "A-Z a-z 0-9 . _ -") {
		t.Error("--help: --node-id does not say which IDs are valid")
	}
	if strings.Contains(out.String(), "test-raft-dial-rewrite") {
		t.Error("--help lists the test-only --test-raft-dial-rewrite")
	}
}
