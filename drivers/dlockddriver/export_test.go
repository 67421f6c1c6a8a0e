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
