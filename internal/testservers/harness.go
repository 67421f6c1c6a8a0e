package testservers

import (
	"errors"
	"fmt"
	"os"
	"sync"
)

// HarnessFatal is the value a Harness panics with on Fatal or Fatalf; Run
// turns it back into an error.
type HarnessFatal struct {
	Msg string
}

func (f *HarnessFatal) Error() string { return f.Msg }

// Harness is a TB for code outside go test (a CLI that starts the same
// servers as the tests): Fatal and Fatalf panic with a *HarnessFatal, which
// Run recovers into an error; Errorf records an error for Err; Cleanup
// functions and TempDir directories are run and removed, last first, by
// Close. All methods are safe for concurrent use; Fatal and Fatalf must be
// called inside Run (on the goroutine that runs fn), as t.Fatal must be on
// the test's goroutine.
type Harness struct {
	logf func(format string, args ...any)

	mu       sync.Mutex
	cleanups []func()
	errs     []error
	failed   bool
	closed   bool
}

// NewHarness returns a Harness that logs with logf (nil discards the log).
func NewHarness(logf func(format string, args ...any)) *Harness {
	return &Harness{logf: logf}
}

var _ TB = (*Harness)(nil)

// Run calls fn and returns the message of a Fatal or Fatalf inside it as an
// error (nil when fn returns normally). Any other panic goes on.
func (h *Harness) Run(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(*HarnessFatal)
			if !ok {
				panic(r)
			}
			err = f
		}
	}()
	fn()
	return nil
}

// Name returns "harness".
func (h *Harness) Name() string { return "harness" }

// Helper does nothing.
func (h *Harness) Helper() {}

// Logf logs with the harness's logf.
func (h *Harness) Logf(format string, args ...any) {
	if h.logf != nil {
		h.logf(format, args...)
	}
}

// Errorf logs the message and records it as an error for Err; the caller
// goes on.
func (h *Harness) Errorf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	h.mu.Lock()
	h.errs = append(h.errs, errors.New(msg))
	h.failed = true
	h.mu.Unlock()
	h.Logf("%s", msg)
}

// Fatalf logs and records the message, then panics with a *HarnessFatal
// (see Run).
func (h *Harness) Fatalf(format string, args ...any) {
	h.fatal(fmt.Sprintf(format, args...))
}

// Fatal is Fatalf with fmt.Sprint's formatting.
func (h *Harness) Fatal(args ...any) {
	h.fatal(fmt.Sprint(args...))
}

func (h *Harness) fatal(msg string) {
	h.mu.Lock()
	h.errs = append(h.errs, errors.New(msg))
	h.failed = true
	h.mu.Unlock()
	h.Logf("%s", msg)
	panic(&HarnessFatal{Msg: msg})
}

// Failed reports whether Errorf, Fatal or Fatalf was called.
func (h *Harness) Failed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failed
}

// Err returns the errors recorded by Errorf, Fatal and Fatalf, joined, or
// nil.
func (h *Harness) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return errors.Join(h.errs...)
}

// Cleanup registers f to be run by Close, after every function registered
// later. After Close, f runs at once.
func (h *Harness) Cleanup(f func()) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.runCleanup(f)
		return
	}
	h.cleanups = append(h.cleanups, f)
	h.mu.Unlock()
}

// TempDir creates a new directory that Close removes. It calls Fatalf when
// the directory cannot be created.
func (h *Harness) TempDir() string {
	dir, err := os.MkdirTemp("", "dlock-harness-")
	if err != nil {
		h.Fatalf("harness: TempDir: %v", err)
	}
	h.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			h.Logf("harness: remove %s: %v", dir, err)
		}
	})
	return dir
}

// Setenv sets an environment variable of the process and restores its
// previous value (or unsets it) at Close.
func (h *Harness) Setenv(key, value string) {
	prev, had := os.LookupEnv(key)
	if err := os.Setenv(key, value); err != nil {
		h.Fatalf("harness: Setenv %s: %v", key, err)
	}
	h.Cleanup(func() {
		if had {
			_ = os.Setenv(key, prev)
		} else {
			_ = os.Unsetenv(key)
		}
	})
}

// Close runs the registered cleanups, last registered first, each once
// (a cleanup that registers another has it run too). A Fatal or Fatalf in a
// cleanup ends that cleanup only; its message is recorded for Err. Closing
// twice does nothing. It returns Err.
func (h *Harness) Close() error {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	for {
		h.mu.Lock()
		n := len(h.cleanups)
		if n == 0 {
			h.mu.Unlock()
			break
		}
		f := h.cleanups[n-1]
		h.cleanups = h.cleanups[:n-1]
		h.mu.Unlock()
		h.runCleanup(f)
	}
	return h.Err()
}

func (h *Harness) runCleanup(f func()) {
	_ = h.Run(f) // a fatal is already recorded
}
