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
