package supervise

// cgroup.go owns the cgroup v2 side: finding the calling process's own
// cgroup directory, making a child cgroup for one run, killing everything
// in it, and removing it.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroup is a child cgroup v2 made for one run.
type cgroup struct{ dir string }

// newCgroup makes a child of the calling process's own cgroup v2. It fails
// when there is no cgroup v2 hierarchy (cgroup v1 only) or the directory is
// not writable (a read-only /sys/fs/cgroup in a container, a systemd scope
// owned by root): the caller falls back to the process group and the
// subreaper.
func newCgroup() (*cgroup, error) {
	base, err := ownCgroupDir()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(base, fmt.Sprintf("dlock-run-%d-%08x", os.Getpid(), rand.Uint32()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	return &cgroup{dir: dir}, nil
}

// ownCgroupDir returns the directory of the calling process's cgroup in the
// cgroup v2 hierarchy, wherever it is mounted (/sys/fs/cgroup on a unified
// system, /sys/fs/cgroup/unified on a hybrid one).
func ownCgroupDir() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	rel, found := "", false
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			rel, found = p, true
		}
	}
	if !found {
		return "", errors.New("no cgroup v2 hierarchy (cgroup v1 only)")
	}
	if strings.HasSuffix(rel, " (deleted)") {
		return "", fmt.Errorf("own cgroup %s was removed", rel)
	}
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer mi.Close()
	sc := bufio.NewScanner(mi)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source super-options
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		root, mnt := unescapeMount(f[3]), unescapeMount(f[4])
		sub, ok := strings.CutPrefix(rel, root)
		if !ok || (sub != "" && root != "/" && !strings.HasPrefix(sub, "/")) {
			continue // this mount shows another part of the hierarchy
		}
		dir := filepath.Join(mnt, sub)
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("cgroup v2 is not mounted where this process's cgroup can be reached")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// open returns a descriptor of the directory for CLONE_INTO_CGROUP.
func (c *cgroup) open() (int, error) {
	return syscall.Open(c.dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
}

// kill SIGKILLs every process in the cgroup and its children at once
// (cgroup.kill, Linux 5.14), forks in flight included. It fails on older
// kernels; the caller then signals each PID from procs.
func (c *cgroup) kill() error {
	return os.WriteFile(filepath.Join(c.dir, "cgroup.kill"), []byte("1"), 0)
}

// procs lists the PIDs in the cgroup and its child cgroups (a nested dlock
// run makes its own below this one).
func (c *cgroup) procs() []int {
	var pids []int
	_ = filepath.WalkDir(c.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range bytes.Fields(b) {
			if pid, err := strconv.Atoi(string(f)); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// populated reports whether any process is left in the cgroup or below it.
func (c *cgroup) populated() bool {
	b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.events"))
	if err != nil {
		return false // gone
	}
	return bytes.Contains(b, []byte("populated 1"))
}

// remove removes the cgroup and any child cgroups left in it, deepest
// first. A cgroup whose last process has just exited can refuse (EBUSY)
// for a moment; remove retries for up to a second. Removing a cgroup that
// is already gone is not an error.
func (c *cgroup) remove() error {
	var dirs []string
	_ = filepath.WalkDir(c.dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs) // children before parents
	var err error
	for _, d := range dirs {
		for try := 0; ; try++ {
			err = syscall.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				err = nil
				break
			}
			if !errors.Is(err, syscall.EBUSY) || try >= 100 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err != nil {
		return fmt.Errorf("removing cgroup %s: %w", c.dir, err)
	}
	return nil
}
