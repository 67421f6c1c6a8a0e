package server

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// killableStream is a TCP raft.StreamLayer whose Close also closes the
// connections it accepted, as a process that exits does.
type killableStream struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (k *killableStream) Accept() (net.Conn, error) {
	c, err := k.Listener.Accept()
	if err == nil {
		k.mu.Lock()
		k.conns = append(k.conns, c)
		k.mu.Unlock()
	}
	return c, err
}

func (k *killableStream) Close() error {
	err := k.Listener.Close()
	k.mu.Lock()
	for _, c := range k.conns {
		_ = c.Close()
	}
	k.mu.Unlock()
	return err
}

func (k *killableStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(address), timeout)
}

// voter is a Raft network transport on addr that grants every vote
// request; kill ends it as a process exit would.
type voter struct {
	tr   *raft.NetworkTransport
	stop chan struct{}
	done chan struct{}
}

func startVoter(t *testing.T, addr string) *voter {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	v := &voter{tr: raft.NewNetworkTransport(&killableStream{Listener: ln}, 3, time.Second, io.Discard), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(v.done)
		for {
			select {
			case rpc := <-v.tr.Consumer():
				rpc.Respond(&raft.RequestVoteResponse{Granted: true}, nil)
			case <-v.stop:
				return
			}
		}
	}()
	return v
}

func (v *voter) kill() {
	_ = v.tr.Close()
	close(v.stop)
	<-v.done
}

// TestVoteTransport_SurvivesAPeerRestart: a vote request to a peer that
// restarted since the last one goes out on a pooled connection the restart
// left dead; NetworkTransport alone fails it (the candidate loses that
// vote), voteTransport sends it again on a new connection and gets the
// vote.
func TestVoteTransport_SurvivesAPeerRestart(t *testing.T) {
	peer := startVoter(t, "127.0.0.1:0")
	addr := peer.tr.LocalAddr()
	cand, err := raft.NewTCPTransport("127.0.0.1:0", nil, 3, time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cand.CloseStreams(); _ = cand.Close() }()
	vote := func(tr raft.Transport) error {
		var resp raft.RequestVoteResponse
		err := tr.RequestVote("peer", addr, &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte("cand"), Addr: []byte(cand.LocalAddr())}, Term: 2}, &resp)
		if err == nil && !resp.Granted {
			t.Fatal("vote not granted")
		}
		return err
	}
	restart := func() {
		t.Helper()
		peer.kill()
		peer = startVoter(t, string(addr))
	}
	defer func() { peer.kill() }()

	if err := vote(cand); err != nil { // pools a connection
		t.Fatal(err)
	}
	restart()
	if err := vote(cand); err == nil || !deadConn(err) {
		t.Fatalf("NetworkTransport's vote request after the peer restarted = %v; want the dead pooled connection's error (the case this guards)", err)
	}
	if err := vote(cand); err != nil { // a fresh connection, pooled again
		t.Fatal(err)
	}
	restart()
	if err := vote(voteTransport{cand}); err != nil {
		t.Fatalf("voteTransport's vote request after the peer restarted = %v; want the vote, sent again on a new connection", err)
	}
}
