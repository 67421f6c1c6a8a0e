package driver

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"sync"
)

// OpenFunc opens a driver for a store URL whose scheme it was registered
// under. It must not return a nil Driver with a nil error.
type OpenFunc func(ctx context.Context, u *url.URL) (Driver, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]OpenFunc{}
)

// Register makes a driver available to dlock.Open under a URL scheme
// ("redis", "dlockd", ...). Drivers call it from init. Like sql.Register, it
// panics when open is nil or the scheme is registered twice.
func Register(scheme string, open OpenFunc) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if open == nil {
		panic("dlock/driver: Register open func is nil for scheme " + scheme)
	}
	if _, dup := registry[scheme]; dup {
		panic("dlock/driver: Register called twice for scheme " + scheme)
	}
	registry[scheme] = open
}

// Lookup returns the OpenFunc registered for scheme, or an error naming the
// registered schemes.
func Lookup(scheme string) (OpenFunc, error) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	if open, ok := registry[scheme]; ok {
		return open, nil
	}
	return nil, fmt.Errorf("dlock: no driver for scheme %q (registered: %v; import the driver package, e.g. _ \"github.com/dlock-dev/dlock/drivers/redisdriver\")", scheme, schemesLocked())
}

// Schemes returns the registered URL schemes, sorted.
func Schemes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	return schemesLocked()
}

func schemesLocked() []string {
	out := make([]string, 0, len(registry))
	for s := range registry {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}
