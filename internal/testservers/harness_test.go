package testservers

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// The testing types keep satisfying TB.
var _ TB = (testing.TB)(nil)

func TestHarness_FatalInRunIsError(t *testing.T) {
	var logged []string
	h := NewHarness(func(format string, args ...any) { logged = append(logged, format) })
	defer h.Close()
	reached := false
	err := h.Run(func() {
		h.Fatalf("boom %d", 7)
		reached = true
	})
	var f *HarnessFatal
	if !errors.As(err, &f) || f.Msg != "boom 7" || err.Error() != "boom 7" {
		t.Fatalf("Run = %v (%T), want *HarnessFatal boom 7", err, err)
	}
	if reached {
		t.Fatal("code after Fatalf ran")
	}
	if !h.Failed() || h.Err() == nil || !strings.Contains(h.Err().Error(), "boom 7") {
		t.Fatalf("Failed %v, Err %v", h.Failed(), h.Err())
	}
	if len(logged) == 0 {
		t.Fatal("Fatalf not logged")
	}
	if err := h.Run(func() { h.Fatal("a", 1) }); err == nil || err.Error() != "a1" {
		t.Fatalf("Fatal: Run = %v", err)
	}
	if err := h.Run(func() {}); err != nil {
		t.Fatalf("normal Run = %v", err)
	}

	// Other panics are not swallowed.
	func() {
		defer func() {
			if r := recover(); r != "other" {
				t.Fatalf("recovered %v, want the original panic", r)
			}
		}()
		_ = h.Run(func() { panic("other") })
	}()
}

func TestHarness_Errorf(t *testing.T) {
	h := NewHarness(nil)
	defer h.Close()
	if h.Failed() || h.Err() != nil {
		t.Fatal("new harness failed")
	}
	if err := h.Run(func() { h.Errorf("soft %s", "fail") }); err != nil {
		t.Fatalf("Errorf stopped Run: %v", err)
	}
	if !h.Failed() || h.Err() == nil || h.Err().Error() != "soft fail" {
		t.Fatalf("Failed %v, Err %v", h.Failed(), h.Err())
	}
	if h.Name() != "harness" {
		t.Fatalf("Name %q", h.Name())
	}
}

func TestHarness_CleanupLIFOOnceAndTempDir(t *testing.T) {
	h := NewHarness(t.Logf)
	var order []int
	var dir string
	err := h.Run(func() {
		h.Cleanup(func() { order = append(order, 1) })
		dir = h.TempDir()
		h.Cleanup(func() {
			order = append(order, 2)
			if _, err := os.Stat(dir); err != nil {
				t.Errorf("TempDir removed before a later cleanup: %v", err)
			}
		})
		h.Cleanup(func() { order = append(order, 3) })
		h.Fatalf("stop here") // Close must still run everything
	})
	if err == nil {
		t.Fatal("no error from Fatalf")
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		t.Fatalf("TempDir %q: %v", dir, err)
	}
	if err := os.WriteFile(dir+"/f", []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = h.Close()
	_ = h.Close()
	if want := []int{3, 2, 1}; !reflect.DeepEqual(order, want) {
		t.Fatalf("cleanups ran %v, want %v", order, want)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("TempDir %q not removed: %v", dir, err)
	}
}

func TestHarness_SetenvRestored(t *testing.T) {
	const key = "DLOCK_HARNESS_TEST_ENV"
	t.Setenv(key, "before")
	h := NewHarness(nil)
	h.Setenv(key, "during")
	if v := os.Getenv(key); v != "during" {
		t.Fatalf("%s = %q during", key, v)
	}
	_ = h.Close()
	if v := os.Getenv(key); v != "before" {
		t.Fatalf("%s = %q after Close, want before", key, v)
	}
}

func TestHarness_FatalInCleanup(t *testing.T) {
	h := NewHarness(nil)
	ran := false
	h.Cleanup(func() { ran = true })
	h.Cleanup(func() { h.Fatal("cleanup failed") })
	if err := h.Close(); err == nil || !strings.Contains(err.Error(), "cleanup failed") {
		t.Fatalf("Close = %v", err)
	}
	if !ran {
		t.Fatal("a fatal cleanup stopped the earlier ones")
	}
}
