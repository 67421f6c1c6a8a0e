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
