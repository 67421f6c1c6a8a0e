package etcddriver

// SetTestHookExpiring sets the hook a lease's loop runs after it marked
// expired grants and before it deletes their entries (nil: none) and
// returns a function that restores the previous hook.
func SetTestHookExpiring(h func()) (restore func()) {
	var p *func()
	if h != nil {
		p = &h
	}
	old := testHookExpiring.Swap(p)
	return func() { testHookExpiring.Store(old) }
}

// SetTestHookNoLoopKeepAlive stops (true) or restarts the shared leases'
// periodic keepalives and returns a function that restores the setting.
func SetTestHookNoLoopKeepAlive(off bool) (restore func()) {
	old := testHookNoLoopKeepAlive.Swap(off)
	return func() { testHookNoLoopKeepAlive.Store(old) }
}
