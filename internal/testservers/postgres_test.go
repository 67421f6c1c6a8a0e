package testservers

import (
	"net"
	"testing"
	"time"
)

func TestPostgres_StartStop(t *testing.T) {
	t0 := time.Now()
	p := StartPostgres(t)
	t.Logf("started in %v: %s", time.Since(t0), p.URL())
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	t0 = time.Now()
	_ = p.Stop()
	t.Logf("stopped in %v", time.Since(t0))
	if _, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Fatal("still listening")
	}
	t0 = time.Now()
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted in %v", time.Since(t0))
}
