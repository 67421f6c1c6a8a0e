package supervise

// proc.go owns the Linux calls the supervisor needs that package syscall
// does not wrap (prctl, waitid without reaping, CLOCK_MONOTONIC) and the
// /proc scan that finds every descendant of the supervisor.

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

const (
	prSetName           = 15 // PR_SET_NAME
	prSetChildSubreaper = 36 // PR_SET_CHILD_SUBREAPER
	clockMonotonic      = 1  // CLOCK_MONOTONIC, the clock behind Go's monotonic readings
	pAll                = 0  // P_ALL
)

// setSubreaper makes the calling process a child subreaper: orphans below
// it are re-parented to it instead of to init.
func setSubreaper() error {
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); e != 0 {
		return e
	}
	return nil
}

// setName sets the calling thread's name (/proc/PID/comm for the main
// thread), which would otherwise be "exe" after exec of /proc/self/exe.
func setName(name string) {
	b := append([]byte(name), 0)
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetName, uintptr(unsafe.Pointer(&b[0])), 0)
}

// monoNow reads CLOCK_MONOTONIC in nanoseconds: the same clock in every
// process on the machine, so a deadline can cross a pipe as an absolute
// value.
func monoNow() int64 {
	var ts syscall.Timespec
	_, _, _ = syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

// awaitChild blocks until some child of the calling process has exited
// (or, with stops, has stopped), without reaping it (waitid WNOWAIT), so
// that the caller can reap under a lock that signalling by PID also holds:
// a PID is never reused while it is an unreaped zombie. The caller must
// consume a stop with wait4(WUNTRACED), or it is reported again. It returns
// ECHILD when there are no children left.
func awaitChild(stops bool) error {
	var info [128]byte // siginfo_t; its content is not needed
	flags := syscall.WEXITED | syscall.WNOWAIT | syscall.WALL
	if stops {
		flags |= syscall.WSTOPPED
	}
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pAll, 0, uintptr(unsafe.Pointer(&info[0])),
			uintptr(flags), 0, 0)
		switch e {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		default:
			return e
		}
	}
}

type procInfo struct {
	pid, ppid, pgrp int
}

// descendants lists every live process below root in the process tree, from
// /proc. With root a subreaper, that is everything root's children started,
// whatever sessions or process groups they moved to.
func descendants(root int) []procInfo {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	children := map[int][]procInfo{}
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + n + "/stat")
		if err != nil {
			continue // gone
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:]) // state ppid pgrp ...
		if len(f) < 3 {
			continue
		}
		ppid, _ := strconv.Atoi(string(f[1]))
		pgrp, _ := strconv.Atoi(string(f[2]))
		children[ppid] = append(children[ppid], procInfo{pid: pid, ppid: ppid, pgrp: pgrp})
	}
	var out []procInfo
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}

// orphanedGroup reports whether process group pgrp is orphaned (POSIX): no
// member has a parent in the same session but another group, so no shell
// can continue it. The kernel discards terminal stop signals (SIGTSTP,
// SIGTTIN, SIGTTOU) sent to such a group. It reads /proc; a group with no
// member is orphaned.
func orphanedGroup(pgrp int) bool {
	d, err := os.Open("/proc")
	if err != nil {
		return true
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, n := range names {
		if _, err := strconv.Atoi(n); err != nil {
			continue
		}
		st, ok := readStat(n)
		if !ok || st.pgrp != pgrp {
			continue
		}
		parent, ok := readStat(strconv.Itoa(st.ppid))
		if ok && parent.sid == st.sid && parent.pgrp != pgrp {
			return false
		}
	}
	return true
}

type statFields struct{ ppid, pgrp, sid int }

// readStat reads a process's parent, process group and session from
// /proc/PID/stat.
func readStat(pid string) (statFields, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return statFields{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return statFields{}, false
	}
	f := bytes.Fields(b[i+1:]) // state ppid pgrp session ...
	if len(f) < 4 {
		return statFields{}, false
	}
	var st statFields
	st.ppid, _ = strconv.Atoi(string(f[1]))
	st.pgrp, _ = strconv.Atoi(string(f[2]))
	st.sid, _ = strconv.Atoi(string(f[3]))
	return st, true
}
