package urlparam

import (
	"errors"
	"strings"

	"github.com/dlock-dev/dlock/driver"
	"net/url"
	"slices"
	"testing"
	"time"
)

func TestHosts(t *testing.T) {
	if got := Hosts(" a:1, ,b:2,"); !slices.Equal(got, []string{"a:1", "b:2"}) {
		t.Fatalf("Hosts = %q", got)
	}
	if got := Hosts(""); len(got) != 0 {
		t.Fatalf("Hosts(\"\") = %q", got)
	}
}

func TestDurations(t *testing.T) {
	a, b := time.Second, time.Minute
	q, _ := url.ParseQuery("a=250ms")
	if err := Durations(q, map[string]*time.Duration{"a": &a, "b": &b}); err != nil || a != 250*time.Millisecond || b != time.Minute {
		t.Fatalf("a=%v b=%v err=%v", a, b, err)
	}
	for _, bad := range []string{"a=0s", "a=-1s", "a=soon"} {
		q, _ := url.ParseQuery(bad)
		if err := Durations(q, map[string]*time.Duration{"a": &a}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestInvalidInputMatchesErrInvalidArgument(t *testing.T) {
	q, _ := url.ParseQuery("a=soon")
	a := time.Second
	for name, err := range map[string]error{
		"duration":      Durations(q, map[string]*time.Duration{"a": &a}),
		"port 99999":    Port("x", "127.0.0.1:99999"),
		"port 0":        Port("x", "127.0.0.1:0"),
		"port name":     Port("x", "[::1]:http"),
		"empty port":    Port("x", "127.0.0.1:"),
		"ports":         Ports("x", "a:1,b:70000"),
		"unknown param": Known("x", q, "b"),
		"wrapped":       Wrap("x", errors.New("bad")),
	} {
		if !errors.Is(err, driver.ErrInvalidArgument) || errors.Is(err, driver.ErrUnavailable) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
		if err != nil && strings.Contains(err.Error(), "invalid argument") {
			t.Errorf("%s: %q repeats the sentinel's text", name, err)
		}
	}
	for _, ok := range []string{"127.0.0.1:1", "127.0.0.1:65535", "host", "[::1]:7450"} {
		if err := Port("x", ok); err != nil {
			t.Errorf("Port(%q) = %v", ok, err)
		}
	}
	if err := Known("x", q, "a"); err != nil {
		t.Errorf("Known: %v", err)
	}
}

func TestAddrs(t *testing.T) {
	for _, tc := range []struct {
		host     string
		needPort bool
		want     string // "" = accepted; else a fragment of the error
	}{
		{"127.0.0.1:7450", true, ""},
		{"[::1]:7450", true, ""},
		{"a:1,b:2", true, ""},
		{"host", false, ""},
		{"[::1]", false, ""},
		{"a,b:2", false, ""},
		{"", false, "names no host"},
		{" ", true, "names no host"},
		{":7450", true, "empty host"},
		{":7450", false, "empty host"},
		{"[]:7450", true, "empty host"},
		{"127.0.0.1", true, "has no port"},
		{"[::1]", true, "has no port"},
		{"127.0.0.1:", false, "empty port"},
		{"127.0.0.1:", true, "empty port"},
		{"a:1,,b:2", true, "empty entry"},
		{"a:1,:2", true, "empty host"},
		{"a:1,b", true, "has no port"},
		{"a:99999", false, "1..65535"},
	} {
		err := Addrs("x", tc.host, "x://HOST:PORT", tc.needPort)
		if tc.want == "" {
			if err != nil {
				t.Errorf("Addrs(%q, %v) = %v", tc.host, tc.needPort, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "x://HOST:PORT") {
			t.Errorf("Addrs(%q, %v) = %v; want an error with %q and the URL shape", tc.host, tc.needPort, err, tc.want)
		}
		if !errors.Is(err, driver.ErrInvalidArgument) {
			t.Errorf("Addrs(%q) = %v; want ErrInvalidArgument", tc.host, err)
		}
	}
}
