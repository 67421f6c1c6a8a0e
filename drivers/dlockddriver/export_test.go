package dlockddriver

// SetWatchReopenHook makes every Driver call f before each attempt to
// reopen its Watch stream after a break, until restore is called. Set it
// before opening the Drivers it is meant for, and restore it after they
// are closed.
func SetWatchReopenHook(f func()) (restore func()) {
	old := watchReopenHook
	watchReopenHook = f
	return func() { watchReopenHook = old }
}

// SetWatchMoveHook makes every Driver call f with its session and the
// member's address before each attempt to move its open Watch stream to
// another member (the belief on the leader moved), until restore is
// called. Set it before opening the Drivers it is meant for, and restore
// it after they are closed.
func SetWatchMoveHook(f func(session, addr string)) (restore func()) {
	old := watchMoveHook
	watchMoveHook = f
	return func() { watchMoveHook = old }
}

// SharedConns returns how many shared gRPC connections the process has open
// (connshare.go).
func SharedConns() int { return sharedConns() }

// SessionOpen reports whether d's Session stream is open (its calls go on
// it rather than as unary RPCs).
func SessionOpen(d *Driver) bool { return d.calls.Load() != nil }

// WaitStreams returns the Wait streams d's first member's connection
// carries, and those on each extra connection dialled for Waits past
// WaitsPerConn (waitconns.go).
func WaitStreams(d *Driver) (first int, extras []int) {
	d.cl.mu.Lock()
	w := d.cl.members[0].waits // set under cl.mu when the member is first dialled
	d.cl.mu.Unlock()
	if w == nil {
		return 0, nil
	}
	return w.counts()
}
