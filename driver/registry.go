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
	if pkg := modulePackages[scheme]; pkg != "" {
		return nil, fmt.Errorf("dlock: %w: no driver registered for scheme %q: import _ %q (registered: %v)", ErrInvalidArgument, scheme, pkg, schemesLocked())
	}
	return nil, fmt.Errorf("dlock: %w: no driver for scheme %q (registered: %v; this module's drivers serve %v)", ErrInvalidArgument, scheme, schemesLocked(), ModuleSchemes())
}

// modulePackages names, for each URL scheme of the drivers in this module,
// the package whose import registers it.
var modulePackages = map[string]string{
	"dlockd":     "github.com/dlock-dev/dlock/drivers/dlockddriver",
	"consul":     "github.com/dlock-dev/dlock/drivers/consuldriver",
	"redis":      "github.com/dlock-dev/dlock/drivers/redisdriver",
	"rediss":     "github.com/dlock-dev/dlock/drivers/redisdriver",
	"redlock":    "github.com/dlock-dev/dlock/drivers/redlockdriver",
	"etcd":       "github.com/dlock-dev/dlock/drivers/etcddriver",
	"dynamodb":   "github.com/dlock-dev/dlock/drivers/dynamodbdriver",
	"zk":         "github.com/dlock-dev/dlock/drivers/zkdriver",
	"postgres":   "github.com/dlock-dev/dlock/drivers/pgdriver",
	"postgresql": "github.com/dlock-dev/dlock/drivers/pgdriver",
	"pgadvisory": "github.com/dlock-dev/dlock/drivers/pgadvisory",
	"mem":        "github.com/dlock-dev/dlock/drivers/memdriver",
	"azblob":     "github.com/dlock-dev/dlock/drivers/azblobdriver",
	"gs":         "github.com/dlock-dev/dlock/drivers/gcsdriver",
}

// ModulePackage returns the import path of the package of this module
// whose import registers the driver of scheme (for example
// "github.com/dlock-dev/dlock/drivers/redisdriver" for "redis"), or "" when
// no driver of this module serves scheme.
func ModulePackage(scheme string) string { return modulePackages[scheme] }

// ModuleSchemes returns the URL schemes of this module's drivers, sorted,
// whether their packages are imported or not.
func ModuleSchemes() []string {
	out := make([]string, 0, len(modulePackages))
	for s := range modulePackages {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
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
