// Package urlparam parses the parts of store URLs that several drivers
// share: a comma-separated host list and positive-duration query
// parameters.
package urlparam

import (
	"fmt"
	"net/url"
	"strings"
	"time"
)

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
			return fmt.Errorf("URL parameter %s=%q is not a positive duration", name, v)
		}
		*dst = d
	}
	return nil
}
