package zkdriver

import (
	"sync"

	"github.com/go-zookeeper/zk"
)

// StallRunLoop makes d's run loop, which reconciles d with its connection
// after session events, stop before its next round, until resume is called
// (or d is closed): a run loop that has fallen behind.
func StallRunLoop(d *Driver) (resume func()) {
	ch := make(chan struct{})
	hook := func() {
		select {
		case <-ch:
		case <-d.closeCtx.Done():
		}
	}
	d.runHook.Store(&hook)
	return sync.OnceFunc(func() {
		d.runHook.Store(nil)
		close(ch)
	})
}

// ConnSession returns the session id of d's go-zookeeper connection when it
// has a session (StateHasSession), else 0, whatever d has made of its
// session events.
func ConnSession(d *Driver) int64 {
	if d.conn.State() != zk.StateHasSession {
		return 0
	}
	return d.conn.SessionID()
}
