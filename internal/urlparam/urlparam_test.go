package urlparam

import (
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
