package testservers

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Freezer freezes a server: SIGSTOP to its process and every descendant
// (PostgreSQL's postmaster and each backend, which runs in a session of its
// own; the single process of Redis, etcd, ZooKeeper or dlockd), so that it
// keeps its sockets and the kernel still accepts connections for it, but
// nothing is ever answered. Thaw sends SIGCONT. A Freezer made by
// NewFreezer always thaws in t.Cleanup, so a failing test never leaves a
// stopped server behind (which could not then be stopped).
type Freezer struct {
	pids func() []int

	mu     sync.Mutex
	frozen []int
}

// NewFreezer returns a Freezer of the servers whose PIDs pids returns when
// Freeze is called (a stopped server's 0 is skipped), thawed in t.Cleanup.
func NewFreezer(t TB, pids func() []int) *Freezer {
	f := &Freezer{pids: pids}
	t.Cleanup(func() { _ = f.Thaw() })
	return f
}

// Freeze sends SIGSTOP to every server process and its descendants, and
// returns once all of them are stopped. Freezing a frozen server does
// nothing.
func (f *Freezer) Freeze() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.frozen) > 0 {
		return nil
	}
	var errs []error
	for _, root := range f.pids() {
		if root <= 0 {
			continue
		}
		// The parent first, so that it forks no new child meanwhile.
		for _, pid := range withDescendants(root) {
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				if !errors.Is(err, syscall.ESRCH) {
					errs = append(errs, fmt.Errorf("testservers: freeze pid %d: %w", pid, err))
				}
				continue
			}
			f.frozen = append(f.frozen, pid)
		}
	}
	if len(f.frozen) == 0 && len(errs) == 0 {
		return errors.New("testservers: freeze: no server running")
	}
	// kill(2) only queues the signal: a process busy on another CPU stops
	// a moment later. Return once every one has.
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range f.frozen {
		for !stopped(pid) {
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("testservers: freeze pid %d: still running after 5 s", pid))
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// Thaw sends SIGCONT to what Freeze stopped. Thawing a running server does
// nothing.
func (f *Freezer) Thaw() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for _, pid := range f.frozen {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("testservers: thaw pid %d: %w", pid, err))
		}
	}
	f.frozen = nil
	return errors.Join(errs...)
}

// procStat returns the state and parent pid of pid from /proc/<pid>/stat.
func procStat(pid int) (state string, ppid int, ok bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", 0, false
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses,
	// so split after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return "", 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0], ppid, true
}

// stopped reports whether pid is stopped (or gone).
func stopped(pid int) bool {
	state, _, ok := procStat(pid)
	return !ok || state == "T" || state == "t" || state == "Z" || state == "X"
}

// withDescendants returns root and every process below it, parents first.
func withDescendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return []int{root} // no procfs: the process alone
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}
