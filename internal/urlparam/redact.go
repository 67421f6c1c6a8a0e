package urlparam

import (
	"net/url"
	"regexp"
)

// secretParam matches the names of query parameters whose values are
// redacted in messages.
var secretParam = regexp.MustCompile(`(?i)pass|pwd|secret|token|key$|credential`)

// Redact returns u as a string with its password and the values of
// secret-looking query parameters (password=, token=, sslkey=, …) replaced
// by "xxxxx", for messages, reports and logs.
func Redact(u *url.URL) string {
	c := *u
	if c.RawQuery != "" {
		q, err := url.ParseQuery(c.RawQuery)
		if err != nil { // a malformed pair: mask by pattern, keep nothing raw
			return RedactRaw(c.Redacted())
		}
		changed := false
		for name, vals := range q {
			if secretParam.MatchString(name) {
				for i := range vals {
					vals[i] = "xxxxx"
				}
				changed = true
			}
		}
		if changed {
			c.RawQuery = q.Encode()
		}
	}
	return c.Redacted()
}

var (
	rawUserinfo = regexp.MustCompile(`^([^:/?#]*://[^:/?#@]*):[^/?#@]*@`)
	rawSecret   = regexp.MustCompile(`(?i)((?:^|[?&;])[^=&;]*(?:pass|pwd|secret|token|key|credential)[^=&;]*=)[^&;#]*`)
)

// RedactRaw redacts a store URL that did not parse, as well as it can: the
// password of a user:password@ and the values of secret-looking
// parameters.
func RedactRaw(s string) string {
	s = rawUserinfo.ReplaceAllString(s, "${1}:xxxxx@")
	return rawSecret.ReplaceAllString(s, "${1}xxxxx")
}

// RedactString redacts a store URL given as text: Redact when it parses,
// else RedactRaw.
func RedactString(s string) string {
	if u, err := url.Parse(s); err == nil {
		return Redact(u)
	}
	return RedactRaw(s)
}
