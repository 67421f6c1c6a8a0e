package matrix

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-dev/dlock/internal/testservers"
)

// lossyDir is the restart-lossy state of one store process whose durable
// state is a data directory (etcd, ZooKeeper, a one-node dlockd): the last
// checkpoint of that directory, a copy in a sibling directory.
//
// The fault it serves is a disk that lies about fsync: every write the
// store acknowledged after the checkpoint (about 2 TTLs before the
// restart: see verify's nemesis) is lost at once, while what it held at
// the checkpoint is intact, as if the disk had kept only what it had
// written back by then. A store that fsyncs before acknowledging promises
// nothing in that case; the experiment shows what it then does.
type lossyDir struct {
	dir string // the store's data directory

	mu   sync.Mutex
	ckpt string // the last checkpoint ("" before the first), beside dir
}

// newLossyDir returns the lossy state of data directory dir; the harness
// removes the last checkpoint when it closes (the copy lives beside dir,
// which on etcd's tmpfs is outside every harness TempDir).
func newLossyDir(h *testservers.Harness, dir string) *lossyDir {
	l := &lossyDir{dir: dir}
	h.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.ckpt != "" {
			_ = os.RemoveAll(l.ckpt)
			l.ckpt = ""
		}
	})
	return l
}

// checkpoint copies the data directory while the store's process pid is
// stopped (SIGSTOP, continued with SIGCONT however the copy ends), so the
// copy is what the files (the page cache included) held at one instant: no
// write is half done, no file of a multi-file state is newer than another.
// It replaces the previous checkpoint. A pid of 0 (the store is not
// running) is an error.
func (l *lossyDir) checkpoint(pid int) error {
	if pid <= 0 {
		return errors.New("checkpoint: the store is not running")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	dst, err := os.MkdirTemp(filepath.Dir(l.dir), filepath.Base(l.dir)+".checkpoint-")
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := stopCopyContinue(pid, l.dir, dst); err != nil {
		_ = os.RemoveAll(dst)
		return fmt.Errorf("checkpoint of %s: %w", l.dir, err)
	}
	if l.ckpt != "" {
		_ = os.RemoveAll(l.ckpt)
	}
	l.ckpt = dst
	return nil
}

// restore replaces the data directory's contents with the last
// checkpoint's. The store must not be running (killed, and gone). The
// checkpoint is kept, so that a second restore without a new checkpoint
// rolls back to the same instant.
func (l *lossyDir) restore() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ckpt == "" {
		return errors.New("restore: no checkpoint taken")
	}
	if err := os.RemoveAll(l.dir); err != nil {
		return fmt.Errorf("restore: remove %s: %w", l.dir, err)
	}
	if err := copyTree(l.ckpt, l.dir); err != nil {
		return fmt.Errorf("restore %s from %s: %w", l.dir, l.ckpt, err)
	}
	return nil
}

// stopCopyContinue stops process pid with SIGSTOP, waits until every one
// of its threads is stopped (a thread inside a write finishes it first),
// copies the tree src to dst (an existing empty directory, or a new one),
// and continues the process with SIGCONT, also on error. It fails, without
// copying, when a thread is still running after 5 s.
func stopCopyContinue(pid int, src, dst string) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP pid %d: %w", pid, err)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
	if err := waitThreadsStopped(pid, 5*time.Second); err != nil {
		return err
	}
	return copyTree(src, dst)
}

// waitThreadsStopped waits up to limit until every thread of pid is in
// state T or t in /proc (or has exited). SIGSTOP takes effect as each
// thread next leaves the kernel, so a thread could still be writing right
// after the kill.
func waitThreadsStopped(pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return fmt.Errorf("threads of pid %d: %w", pid, err)
		}
		running := ""
		for _, tk := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, tk.Name()))
			if err != nil {
				continue // the thread ended
			}
			// The state follows the command name in parentheses.
			i := bytes.LastIndexByte(b, ')')
			if i < 0 || i+2 >= len(b) {
				running = tk.Name()
				break
			}
			if st := b[i+2]; st != 'T' && st != 't' && st != 'Z' && st != 'X' {
				running = tk.Name()
				break
			}
		}
		if running == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("thread %s of pid %d still running %v after SIGSTOP", running, pid, limit)
		}
		time.Sleep(time.Millisecond)
	}
}

// copyTree copies the directory tree src to dst: directories and regular
// files with their permission bits, symbolic links as links. dst may exist
// (empty) or not. Sockets, pipes and devices hold no durable state and are
// skipped. Runs of zeros in a file (preallocated log segments: etcd's WAL
// and ZooKeeper's log are 64 MiB each) are left as holes, so a copy costs
// what the store has written, not what it reserved.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch mode := info.Mode(); {
		case mode.IsDir():
			if err := os.MkdirAll(to, mode.Perm()); err != nil {
				return err
			}
			return os.Chmod(to, mode.Perm()) // dst made by MkdirTemp is 0700
		case mode.IsRegular():
			return copyFile(path, to, mode.Perm())
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		default:
			return nil
		}
	})
}

// copyFile copies regular file src to the new file dst with mode perm,
// leaving every all-zero 64 KiB block a hole.
func copyFile(src, dst string, perm fs.FileMode) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	const block = 64 << 10
	buf, zero := make([]byte, block), make([]byte, block)
	var off int64
	for {
		n, rerr := io.ReadFull(in, buf)
		if n > 0 && !bytes.Equal(buf[:n], zero[:n]) {
			if _, err := out.WriteAt(buf[:n], off); err != nil {
				return err
			}
		}
		off += int64(n)
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return rerr
		}
	}
	return out.Truncate(off) // the size, with a trailing hole
}
