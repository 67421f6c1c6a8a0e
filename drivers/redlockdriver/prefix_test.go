package redlockdriver_test

import (
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/redlockdriver"
	"github.com/dlock-dev/dlock/internal/testservers"
)

// TestOpen_PrefixParameter: prefix=P puts every key the driver writes on
// every node (lock key and fence counter) under "P:", and drivers with
// different prefixes do not exclude each other.
func TestOpen_PrefixParameter(t *testing.T) {
	rs := testservers.StartRedisN(t, 3)
	hosts := rs[0].Addr() + "," + rs[1].Addr() + "," + rs[2].Addr()
	a, err := dlock.Open(t.Context(), "redlock://"+hosts+"?prefix=bench-a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := dlock.Open(t.Context(), "redlock://"+hosts+"?prefix=bench-b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	la, err := a.TryAcquire(t.Context(), "k", dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lb, err := b.TryAcquire(t.Context(), "k", dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatalf("a driver on another prefix could not take the key: %v", err)
	}
	for i, r := range rs {
		c := redis.NewClient(&redis.Options{Addr: r.Addr()})
		keys, err := c.Keys(t.Context(), "*").Result()
		_ = c.Close()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(keys)
		if len(keys) != 4 {
			t.Errorf("node %d keys = %q; want a lock key and a fence counter for each prefix", i, keys)
		}
		for _, k := range keys {
			if !strings.HasPrefix(k, "bench-a:") && !strings.HasPrefix(k, "bench-b:") {
				t.Errorf("node %d has key %q outside the prefixes", i, k)
			}
		}
	}
	if err := la.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := lb.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestOpen_PrefixMalformedIsInvalidArgument: an empty, repeated, too long or
// unprintable prefix is the caller's error.
func TestOpen_PrefixMalformedIsInvalidArgument(t *testing.T) {
	rs := testservers.StartRedisN(t, 3)
	hosts := rs[0].Addr() + "," + rs[1].Addr() + "," + rs[2].Addr()
	for _, q := range []string{
		"prefix=",
		"prefix=a&prefix=b",
		"prefix=" + strings.Repeat("x", redlockdriver.MaxURLPrefixBytes+1),
		"prefix=a%20b",
		"prefix=a%0Ab",
		"prefix=%FF",
	} {
		u, err := url.Parse("redlock://" + hosts + "?" + q)
		if err != nil {
			t.Fatal(err)
		}
		d, err := redlockdriver.Open(t.Context(), u)
		if err == nil {
			_ = d.Close()
			t.Errorf("Open(?%s) accepted", q)
			continue
		}
		if !errors.Is(err, driver.ErrInvalidArgument) || !strings.Contains(err.Error(), "prefix") {
			t.Errorf("Open(?%s) = %v; want ErrInvalidArgument naming prefix", q, err)
		}
	}
}
