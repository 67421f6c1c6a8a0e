package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkProfileCell runs one W1 cell (BENCH_PROFILE_CLIENTS clients, default
// 64, each on its own key, for BENCH_DURATION, default 10 s), or with
// BENCH_PROFILE_WORKLOAD=w2 one W2 cell (the clients queue on one key; a
// cycle is then a handoff, and the gap p50 is reported too), against the
// store at BENCH_PROFILE_STORE, so that go test's -cpuprofile records the
// client side of the cycle (the dlock library and the driver) while the
// server's own profile is taken from its --pprof endpoint. It does nothing
// without BENCH_PROFILE_STORE. scripts/profile.sh runs both:
//
//	BENCH_PROFILE_STORE=dlockd://127.0.0.1:7450 go test -run '^$' \
//	  -bench ProfileCell -benchtime 1x -cpuprofile client.prof ./internal/bench
//
// Beside cycles/s it reports what a cycle costs, which moves less than
// throughput on a shared machine: CPU time (µs) and read/write system
// calls (/proc/PID/io syscr + syscw) per cycle, of this process (the
// clients) and, given BENCH_PROFILE_SERVER_PID, of the server.
func BenchmarkProfileCell(b *testing.B) {
	store := os.Getenv("BENCH_PROFILE_STORE")
	if store == "" {
		b.Skip("BENCH_PROFILE_STORE is not set: nothing to profile")
	}
	dur := 10 * time.Second
	if v := os.Getenv("BENCH_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("BENCH_DURATION: %v", err)
		}
		dur = d
	}
	clients := envInt(b, "BENCH_PROFILE_CLIENTS", 64)
	server := envInt(b, "BENCH_PROFILE_SERVER_PID", 0)
	w2 := false
	switch w := os.Getenv("BENCH_PROFILE_WORKLOAD"); w {
	case "", "w1":
	case "w2":
		w2 = true
	default:
		b.Fatalf("BENCH_PROFILE_WORKLOAD %q: want w1 or w2", w)
	}
	for b.Loop() {
		c0, s0 := processCost(b, os.Getpid()), processCost(b, server)
		var rate float64
		if w2 {
			r, err := contended(context.Background(), store, clients, dur)
			if err != nil {
				b.Fatal(err)
			}
			rate = r.HandoffsPerSec
			b.ReportMetric(r.GapP50Us, "gap-p50-µs")
		} else {
			r, err := uncontended(context.Background(), store, clients, dur)
			if err != nil {
				b.Fatal(err)
			}
			rate = r.CyclesPerSec
		}
		c1, s1 := processCost(b, os.Getpid()), processCost(b, server)
		cycles := rate * dur.Seconds()
		b.ReportMetric(rate, "cycles/s")
		b.ReportMetric(float64(c1.cpu-c0.cpu)/float64(time.Microsecond)/cycles, "client-cpu-µs/cycle")
		b.ReportMetric(float64(c1.syscalls-c0.syscalls)/cycles, "client-rw-syscalls/cycle")
		if server > 0 {
			b.ReportMetric(float64(s1.cpu-s0.cpu)/float64(time.Microsecond)/cycles, "server-cpu-µs/cycle")
			b.ReportMetric(float64(s1.syscalls-s0.syscalls)/cycles, "server-rw-syscalls/cycle")
		}
	}
}

// cost is a process's CPU time (user + system) and its read and write
// system calls so far.
type cost struct {
	cpu      time.Duration
	syscalls int64
}

// processCost reads pid's cost from /proc (zero for pid 0).
func processCost(b *testing.B, pid int) cost {
	if pid <= 0 {
		return cost{}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("process %d: %v", pid, err)
	}
	// Fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th (fields 14 and 15 of proc(5)), in clock ticks.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	c := cost{cpu: time.Duration(ut+st) * time.Second / ticks}
	io, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		b.Fatalf("process %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(io), "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if n, err := strconv.ParseInt(v, 10, 64); ok && err == nil && (k == "syscr" || k == "syscw") {
			c.syscalls += n
		}
	}
	return c
}
