package azblobdriver

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/dlock-dev/dlock/driver"
)

func mustParse(t *testing.T, raw string) config {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatalf("parseURL(%q): %v", raw, err)
	}
	return cfg
}

// TestParseURL_Defaults: the endpoint defaults to the account's public
// Blob endpoint, auth to the SDK's default chain, and the container is
// created when missing.
func TestParseURL_Defaults(t *testing.T) {
	cfg := mustParse(t, "azblob://myaccount/locks")
	want := config{account: "myaccount", container: "locks", endpoint: "https://myaccount.blob.core.windows.net", auth: "default", create: true}
	if cfg != want {
		t.Fatalf("parseURL = %+v, want %+v", cfg, want)
	}
	if got := cfg.containerURL(); got != "https://myaccount.blob.core.windows.net/locks" {
		t.Fatalf("containerURL = %q", got)
	}
	cfg = mustParse(t, "azblob://devstoreaccount1/my-locks-2?endpoint=http%3A%2F%2F127.0.0.1%3A10000%2Fdevstoreaccount1%2F&auth=emulator&create_container=false")
	want = config{account: "devstoreaccount1", container: "my-locks-2", endpoint: "http://127.0.0.1:10000/devstoreaccount1/", auth: "emulator"}
	if cfg != want || cfg.containerURL() != "http://127.0.0.1:10000/devstoreaccount1/my-locks-2" {
		t.Fatalf("parseURL = %+v (%s), want %+v", cfg, cfg.containerURL(), want)
	}
}

// TestNewDriver_Credentials: each auth= makes a client without I/O; the
// shared key comes from AZURE_STORAGE_KEY only, and a bad one is named, not
// shown.
func TestNewDriver_Credentials(t *testing.T) {
	for _, raw := range []string{
		"azblob://myaccount/locks", // DefaultAzureCredential: built without I/O
		"azblob://devstoreaccount1/locks?auth=emulator&endpoint=http%3A%2F%2F127.0.0.1%3A1%2Fdevstoreaccount1",
	} {
		d, err := newDriver(mustParse(t, raw))
		if err != nil {
			t.Fatalf("newDriver(%q): %v", raw, err)
		}
		_ = d.Close()
	}
	sk := mustParse(t, "azblob://myaccount/locks?auth=sharedkey")
	t.Setenv(KeyEnv, EmulatorKey)
	d, err := newDriver(sk)
	if err != nil {
		t.Fatalf("newDriver with %s set: %v", KeyEnv, err)
	}
	_ = d.Close()
	const bad = "not!base64!secret"
	t.Setenv(KeyEnv, bad)
	_, err = newDriver(sk)
	if !errors.Is(err, driver.ErrInvalidArgument) || strings.Contains(err.Error(), bad) {
		t.Fatalf("newDriver with a bad key = %v, want ErrInvalidArgument without the key", err)
	}
}
