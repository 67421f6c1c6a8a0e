// Package urlparam parses the parts of store URLs that several drivers
// share: a comma-separated host list, ports, known parameters and
// positive-duration query parameters. Every error it returns matches
// driver.ErrInvalidArgument: a bad URL is the caller's input, never an
// outage.
package urlparam

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-dev/dlock/driver"
)

// Invalid returns an error matching driver.ErrInvalidArgument whose text is
// the formatted message (the sentinel's own text is not repeated).
func Invalid(format string, a ...any) error {
	err := fmt.Errorf(format, a...)
	return &invalid{msg: err.Error(), err: err}
}

// Wrap returns err marked as invalid input: an error matching
// driver.ErrInvalidArgument and err, with err's text prefixed by prefix
// (when not empty, followed by ": "). It returns nil for a nil err.
func Wrap(prefix string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if prefix != "" {
		msg = prefix + ": " + msg
	}
	return &invalid{msg: msg, err: err}
}

type invalid struct {
	msg string
	err error
}

func (e *invalid) Error() string { return e.msg }
func (e *invalid) Unwrap() []error {
	return []error{driver.ErrInvalidArgument, e.err}
}

// Port checks the port of one "host:port" address (or a bare host, which
// has none): when present it must be a decimal number in 1..65535, and
// "host:" with an empty port is an error (it reads as a template whose
// port variable was unset). what names the URL's scheme or driver in the
// error. Port does not check the host: see Addrs.
func Port(what, hostport string) error {
	_, port, err := net.SplitHostPort(hostport)
	if err != nil {
		var aerr *net.AddrError
		if errors.As(err, &aerr) && aerr.Err == "missing port in address" {
			return nil
		}
		return Invalid("%s: address %q: %v", what, hostport, err)
	}
	if port == "" {
		return Invalid("%s: address %q has an empty port", what, hostport)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return Invalid("%s: address %q: port %q is not a number in 1..65535", what, hostport, port)
	}
	return nil
}

// Ports checks every address of a comma-separated host list, as Port does.
func Ports(what, host string) error {
	for _, h := range Hosts(host) {
		if err := Port(what, h); err != nil {
			return err
		}
	}
	return nil
}

// Known returns an error naming the first query parameter of q that is not
// in known (and the known ones), or nil.
func Known(what string, q url.Values, known ...string) error {
	var unknown []string
	for name := range q {
		if !slices.Contains(known, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	if len(known) == 0 {
		return Invalid("%s: unknown URL parameter %q (it takes none)", what, unknown[0])
	}
	return Invalid("%s: unknown URL parameter %q (known: %s)", what, unknown[0], strings.Join(known, ", "))
}

// Hosts splits a URL host of the form "h1:p1,h2:p2,…" into its non-empty,
// trimmed entries.
func Hosts(host string) []string {
	var out []string
	for _, h := range strings.Split(host, ",") {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// Durations sets *dst from the query parameter of each name in params that
// is present; a value that is not a positive time.Duration is an error
// naming the parameter. Absent parameters leave *dst unchanged.
func Durations(q url.Values, params map[string]*time.Duration) error {
	for name, dst := range params {
		v := q.Get(name)
		if v == "" {
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return Invalid("URL parameter %s=%q is not a positive duration", name, v)
		}
		*dst = d
	}
	return nil
}

// Addrs checks the host part of a store URL, one address or a
// comma-separated list: there must be at least one address, no entry may
// be empty, every entry must name a host (an empty host is never read as
// 127.0.0.1 or localhost: with DLOCK_STORE=dlockd://$LOCKHOST:7450 and
// LOCKHOST unset, every machine would lock against its own server), and
// every port must be a number in 1..65535. A port that is absent is allowed
// only when !needPort (the driver documents a default port); "host:" with
// nothing after the colon is always an error. what names the driver in the
// message and shape is the URL's form (e.g. "dlockd://HOST:PORT"), shown so
// the message says what to write. Every error matches
// driver.ErrInvalidArgument.
func Addrs(what, host, shape string, needPort bool) error {
	if strings.TrimSpace(host) == "" {
		return Invalid("%s: the URL names no host (want %s)", what, shape)
	}
	for _, h := range strings.Split(host, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return Invalid("%s: URL host list %q has an empty entry (want %s)", what, host, shape)
		}
		if err := addr(what, h, shape, needPort); err != nil {
			return err
		}
	}
	return nil
}

func addr(what, hostport, shape string, needPort bool) error {
	name, port, err := net.SplitHostPort(hostport)
	if err != nil {
		var aerr *net.AddrError
		if !errors.As(err, &aerr) || aerr.Err != "missing port in address" {
			return Invalid("%s: address %q: %v (want %s)", what, hostport, err, shape)
		}
		name = strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]")
		if name == "" {
			return Invalid("%s: address %q has an empty host (want %s)", what, hostport, shape)
		}
		if needPort {
			return Invalid("%s: address %q has no port (want %s)", what, hostport, shape)
		}
		return nil
	}
	if name == "" {
		return Invalid("%s: address %q has an empty host (want %s)", what, hostport, shape)
	}
	if port == "" {
		return Invalid("%s: address %q has an empty port (want %s)", what, hostport, shape)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return Invalid("%s: address %q: port %q is not a number in 1..65535 (want %s)", what, hostport, port, shape)
	}
	return nil
}
