package dlock

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

// supportedSchemes returns the schemes of this module's drivers and of any
// other registered driver, sorted.
func supportedSchemes() []string {
	out := append(driver.Schemes(), driver.ModuleSchemes()...)
	slices.Sort(out)
	return slices.Compact(out)
}

// parseStoreURL parses a store URL for Open. Every error matches
// ErrInvalidArgument and says what to write instead: a missing scheme
// suggests dlockd://, an unknown one lists the supported schemes, a port
// outside 1..65535 is refused here rather than failing every call later as
// an outage.
func parseStoreURL(raw string) (*url.URL, error) {
	s := strings.TrimSpace(raw)
	if s == "" {
		return nil, fmt.Errorf("%w: empty store URL (for example dlockd://127.0.0.1:7450; supported schemes: %s)",
			ErrInvalidArgument, strings.Join(supportedSchemes(), ", "))
	}
	if !strings.Contains(s, "://") && looksLikeHost(s) {
		return nil, fmt.Errorf("%w: store URL %q has no scheme: did you mean dlockd://%s? (supported schemes: %s)",
			ErrInvalidArgument, redactRaw(s), redactRaw(s), strings.Join(supportedSchemes(), ", "))
	}
	u, err := url.Parse(s)
	if err != nil {
		if ue, ok := err.(*url.Error); ok {
			err = ue.Err // its message repeats the URL, unredacted
		}
		return nil, fmt.Errorf("%w: store URL %q: %w", ErrInvalidArgument, redactRaw(s), err)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("%w: store URL %q has no scheme (write scheme://…, e.g. dlockd://127.0.0.1:7450; supported schemes: %s)",
			ErrInvalidArgument, redactRaw(s), strings.Join(supportedSchemes(), ", "))
	}
	if err := checkPorts(u.Host); err != nil {
		return nil, fmt.Errorf("%w: store URL %s: %w", ErrInvalidArgument, redactURL(u), err)
	}
	return u, nil
}

// looksLikeHost reports whether s, which has no "://", reads as a host or
// host:port rather than a URL: no slash, no space, and either a port of
// digits after the last colon, or no colon at all and a dot (an address or
// domain name) or "localhost".
func looksLikeHost(s string) bool {
	if strings.ContainsAny(s, "/ \t?#@") {
		return false
	}
	host, port := s, ""
	if i := strings.LastIndexByte(s, ':'); i >= 0 && i > strings.LastIndexByte(s, ']') {
		host, port = s[:i], s[i+1:]
		if port == "" || strings.Trim(port, "0123456789") != "" {
			return false
		}
		if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
			return false // an IPv6 address needs brackets
		}
	} else if strings.Contains(s, ":") && !strings.HasPrefix(s, "[") {
		return false
	}
	if port != "" {
		return host != ""
	}
	return strings.Contains(host, ".") || host == "localhost" || strings.HasPrefix(host, "[")
}

// checkPorts checks the port of every comma-separated host:port in host (a
// URL's host part; Redlock, etcd and ZooKeeper URLs list several): a port
// after a colon must be a number in 1..65535, and not empty. An empty host
// or an absent port is left to the driver, which knows whether it has a
// default (libpq reads an empty host as PGHOST or the Unix socket; this
// module's other drivers refuse an empty host, see their package docs).
func checkPorts(host string) error {
	for _, h := range strings.Split(host, ",") {
		i := strings.LastIndexByte(h, ':')
		if i < 0 || i < strings.LastIndexByte(h, ']') {
			continue
		}
		p := h[i+1:]
		if p == "" {
			// "host:" reads as a template whose port variable was unset;
			// never let a driver read it as its default port.
			return fmt.Errorf("%q has an empty port", h)
		}
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %q of %q is not a number in 1..65535", p, h)
		}
	}
	return nil
}

// noDriver explains a scheme no registered driver serves: the package to
// import for a scheme of this module's drivers, the supported schemes for
// any other, and dlockd:// for what reads as host:port ("localhost:7450"
// parses as scheme "localhost").
func noDriver(u *url.URL) error {
	if pkg := driver.ModulePackage(u.Scheme); pkg != "" {
		return fmt.Errorf("%w: no driver registered for scheme %q: import _ %q (registered: %s)",
			ErrInvalidArgument, u.Scheme, pkg, orNone(driver.Schemes()))
	}
	if u.Opaque != "" && strings.Trim(u.Opaque, "0123456789") == "" {
		return fmt.Errorf("%w: store URL %q has no scheme: did you mean dlockd://%s:%s? (supported schemes: %s)",
			ErrInvalidArgument, u.Scheme+":"+u.Opaque, u.Scheme, u.Opaque, strings.Join(supportedSchemes(), ", "))
	}
	return fmt.Errorf("%w: unknown store scheme %q (supported schemes: %s)",
		ErrInvalidArgument, u.Scheme, strings.Join(supportedSchemes(), ", "))
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// redactURL returns u as a string with its password and the values of
// secret-looking query parameters replaced by "xxxxx" (urlparam.Redact).
func redactURL(u *url.URL) string { return urlparam.Redact(u) }

// redactRaw redacts a store URL that did not parse (urlparam.RedactRaw).
func redactRaw(s string) string { return urlparam.RedactRaw(s) }
