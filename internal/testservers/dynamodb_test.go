package testservers

import (
	"net"
	"testing"
	"time"
)

// TestDynalite_SurvivesAClientThatGoesAwayMidRequest: a client that sends
// part of a request and closes its connection (a cut link, a call given
// up) does not end dynalite, which crashed on it before (its request error
// handler throws): it still answers afterwards, as the same process.
func TestDynalite_SurvivesAClientThatGoesAwayMidRequest(t *testing.T) {
	d := StartDynalite(t)
	pid := d.PID()
	for range 3 {
		c, err := net.Dial("tcp", d.Addr())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-amz-json-1.0\r\nX-Amz-Target: DynamoDB_20120810.ListTables\r\nContent-Length: 1000\r\n\r\n{\"Lim"))
		time.Sleep(50 * time.Millisecond) // the request is being read
		_ = c.(*net.TCPConn).SetLinger(0) // a reset, as a cut link gives
		_ = c.Close()
	}
	if err := waitDynalite(d.Endpoint(), d.proc, 5*time.Second); err != nil {
		t.Fatalf("dynalite after clients went away mid-request: %v", err)
	}
	if got := d.PID(); got != pid {
		t.Fatalf("dynalite's PID %d after the aborted requests, want the same process %d", got, pid)
	}
}
