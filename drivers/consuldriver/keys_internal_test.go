package consuldriver

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/dlock-dev/dlock/driver"
)

func TestEscapeKey_RoundTripsAndKeepsShape(t *testing.T) {
	for _, k := range []string{"a", "a/b", "%", ".", "..", ".x", "a b", "émoji 🔒", "x\x01y", strings.Repeat("/", 512), "A-Z_0-9"} {
		e := escapeKey(k)
		if strings.Contains(e, "/") || strings.HasPrefix(e, ".") || strings.Contains(e, ".") {
			t.Errorf("escapeKey(%q) = %q: has '/' or '.'", k, e)
		}
		back, ok := unescapeKey(e)
		if !ok || back != k {
			t.Errorf("unescapeKey(escapeKey(%q)) = %q, %v", k, back, ok)
		}
		for i := 0; i <= len(k); i++ {
			if !strings.HasPrefix(e, escapeKey(k[:i])) {
				t.Errorf("escape of the prefix %q of %q is not a prefix of %q", k[:i], k, e)
			}
		}
	}
	for _, bad := range []string{"%", "%4", "%zz", "%4a", "a.b", "a/b", "a b"} {
		if _, ok := unescapeKey(bad); ok {
			t.Errorf("unescapeKey(%q) accepted a string escapeKey never returns", bad)
		}
	}
}

func TestStoreErr_Classifies(t *testing.T) {
	d := newDriver(&api.Client{}, nil, Options{})
	for _, tc := range []struct {
		err  error
		want error
		not  error
	}{
		{api.StatusError{Code: 500, Body: "Invalid Session TTL '50000000', must be between [10s=24h0m0s]"}, driver.ErrInvalidTTL, nil},
		{api.StatusError{Code: 403, Body: "Permission denied: token lacks session:write"}, driver.ErrPermissionDenied, nil},
		{errors.New("Unexpected response code: 403 (ACL not found)"), driver.ErrPermissionDenied, nil},
		{api.StatusError{Code: 400, Body: "Request decode failed"}, driver.ErrInvalidArgument, nil},
		{api.StatusError{Code: 500, Body: "No cluster leader"}, nil, driver.ErrInvalidArgument},
		{api.StatusError{Code: 429, Body: "rate limit exceeded"}, nil, driver.ErrInvalidArgument},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), nil, driver.ErrInvalidArgument},
	} {
		got := d.storeErr("op", tc.err)
		if tc.want != nil && !errors.Is(got, tc.want) {
			t.Errorf("storeErr(%v) = %v, want it to match %v", tc.err, got, tc.want)
		}
		if tc.not != nil && errors.Is(got, tc.not) {
			t.Errorf("storeErr(%v) = %v, must not match %v (an outage is not invalid input)", tc.err, got, tc.not)
		}
		if !errors.Is(got, tc.err) && !strings.Contains(got.Error(), tc.err.Error()) {
			t.Errorf("storeErr(%v) = %v: the store's error is not kept", tc.err, got)
		}
	}
}

func TestCheckOptions(t *testing.T) {
	for _, o := range []Options{
		{Behavior: "keep"}, {LockDelay: -time.Second}, {LockDelay: time.Microsecond}, {LockDelay: 61 * time.Second},
		{OpTimeout: -1}, {Prefix: "a/.b"}, {Prefix: "a//b"}, {Prefix: strings.Repeat("p", 257)}, {Prefix: "a\nb"},
	} {
		if err := checkOptions(&o); !errors.Is(err, driver.ErrInvalidArgument) {
			t.Errorf("checkOptions(%+v) = %v, want ErrInvalidArgument", o, err)
		}
	}
	for _, o := range []Options{{}, {Behavior: BehaviorRelease, LockDelay: time.Millisecond, Prefix: "/team/app/"}, {LockDelay: MaxLockDelay}} {
		if err := checkOptions(&o); err != nil {
			t.Errorf("checkOptions(%+v) = %v, want nil", o, err)
		}
	}
}
