package main_test

// Issue 13: `dlock status` of a key in dlockd's lock-delay (its holder was
// lost without a release: force release or expiry) says so, and not
// "free", even without waiters; once the delay ends it says free.

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/server/servertest"
)

// statusOf runs dlock status on key, text and JSON.
func statusOf(t *testing.T, store, key string) (string, map[string]any) {
	t.Helper()
	res := dlock(t, store, "status", key)
	wantCode(t, res, 0)
	jres := dlock(t, store, "status", "-o", "json", key)
	wantCode(t, jres, 0)
	var js map[string]any
	if err := json.Unmarshal([]byte(jres.stdout), &js); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, jres.stdout)
	}
	return strings.TrimSpace(res.stdout), js
}

// wantDelayed checks that text and js describe key in its lock-delay, with
// at most max left.
func wantDelayed(t *testing.T, key, text string, js map[string]any, max time.Duration) {
	t.Helper()
	if !strings.HasPrefix(text, key+": not held; in its lock-delay for ") || !strings.Contains(text, "more (grants refused until then)") {
		t.Fatalf("status in a lock-delay: %q", text)
	}
	secs, ok := js["lock_delay_seconds"].(float64)
	if js["held"] != false || !ok || secs <= 0 || secs > max.Seconds() {
		t.Fatalf("status -o json in a lock-delay: %v; want held false and lock_delay_seconds in (0, %v]", js, max.Seconds())
	}
	if _, ok := js["waiters"]; ok {
		t.Fatalf("status -o json: %v; no waiter is queued", js)
	}
}

// awaitFree polls status until key is free and returns when it was first
// seen free.
func awaitFree(t *testing.T, store, key string, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		text, js := statusOf(t, store, key)
		if text == key+": free" {
			if len(js) != 2 || js["held"] != false || js["key"] != key {
				t.Fatalf("status -o json of a free key: %v", js)
			}
			return time.Now()
		}
		if !strings.Contains(text, "in its lock-delay") {
			t.Fatalf("status while waiting for the delay to end: %q", text)
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %q after %v", text, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestStatus_LockDelayAfterForceRelease: dlockd with --lock-delay 4s; a
// holder is force-released; status says lock-delay (not free), a new run
// is refused, and status says free once the delay has run out, not before.
func TestStatus_LockDelayAfterForceRelease(t *testing.T) {
	const delay = 4 * time.Second
	store := "dlockd://" + servertest.StartProcess(t, "--lock-delay", delay.String()).Addr()
	const key = "delay:force"
	startHolder(t, store, key, "--ttl", "1h")

	released := time.Now()
	wantCode(t, dlock(t, store, "release", "--force", key, "--reason", "lock-delay test"), 0)
	text, js := statusOf(t, store, key)
	wantDelayed(t, key, text, js, delay)
	t.Logf("right after the force release: %s", text)
	// fence check: not current, and not called free either.
	fc := dlock(t, store, "fence", "check", key, "1")
	wantCode(t, fc, 1)
	if !strings.HasPrefix(fc.stdout, "not current (the key is not held; in its lock-delay for ") {
		t.Fatalf("fence check in a lock-delay: %q", fc.stdout)
	}
	// Grants are refused meanwhile: the key is held in all but name.
	res := dlock(t, store, "run", key, "--", "true")
	if time.Since(released) < delay-500*time.Millisecond {
		wantCode(t, res, 75)
	}
	free := awaitFree(t, store, key, delay+10*time.Second)
	if got := free.Sub(released); got < delay-100*time.Millisecond {
		t.Fatalf("free %v after the force release; the lock-delay is %v", got, delay)
	}
	wantCode(t, dlock(t, store, "run", key, "--", "true"), 0)
}

// TestStatus_LockDelayAfterExpiry: a holder killed with SIGKILL (its lease
// expires: lost without a release) leaves its key in a lock-delay, capped
// at the grant's TTL; status says so, then free.
func TestStatus_LockDelayAfterExpiry(t *testing.T) {
	const ttl = 2 * time.Second
	store := "dlockd://" + servertest.StartProcess(t, "--lock-delay", "1m").Addr()
	const key = "delay:expiry"
	holder := startHolder(t, store, key, "--ttl", ttl.String())
	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Poll until the grant expires: the first status that is not held
	// must show the lock-delay.
	deadline := time.Now().Add(ttl + 10*time.Second)
	for {
		text, js := statusOf(t, store, key)
		// The text and JSON answers are two calls: the grant may expire
		// between them, so either saying held means poll again.
		if js["held"] == true || strings.Contains(text, "held by:") {
			if time.Now().After(deadline) {
				t.Fatalf("still held %v after the holder was killed", ttl+10*time.Second)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		wantDelayed(t, key, text, js, ttl) // the 1m delay is capped at the TTL
		t.Logf("after the expiry: %s", text)
		break
	}
	awaitFree(t, store, key, ttl+10*time.Second)
}
