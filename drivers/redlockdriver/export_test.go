package redlockdriver

// FenceCounterKey exposes the name of key's shared fence counter to the
// external tests.
func (d *Driver) FenceCounterKey(key string) string { return d.fenceKey(key) }

// LegacyFenceKey exposes the name of key's per-key fence counter of earlier
// versions to the external tests.
func (d *Driver) LegacyFenceKey(key string) string { return d.legacyFenceKey(key) }
