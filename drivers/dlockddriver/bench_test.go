package dlockddriver_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/server/servertest"
)

// The benchmarks run the dlockd binary in a subprocess, fsync on, single
// node, with the clients in this process.

// benchArgs: DLOCKD_BENCH_NO_SESSION=1 makes the clients use unary RPCs
// instead of their Session stream; DLOCKD_BENCH_PRIVATE_CONN=1 gives each
// client its own connection (Options.PrivateConn) instead of sharing one,
// as clients in separate processes would have; DLOCKD_BENCH_NO_FSYNC=1 runs the server without fsync, to
// separate the disk's cost from the rest; DLOCKD_BENCH_ARGS adds flags.
func benchArgs() []string {
	args := strings.Fields(os.Getenv("DLOCKD_BENCH_ARGS"))
	if os.Getenv("DLOCKD_BENCH_NO_FSYNC") == "1" {
		args = append(args, "--unsafe-no-fsync")
	}
	return args
}

func dialN(b *testing.B, addr string, n int) []*dlockddriver.Driver {
	b.Helper()
	ds := make([]*dlockddriver.Driver, n)
	for i := range ds {
		d, err := dlockddriver.Dial(addr, &dlockddriver.Options{NoWatch: true, NoSession: os.Getenv("DLOCKD_BENCH_NO_SESSION") == "1",
			PrivateConn: os.Getenv("DLOCKD_BENCH_PRIVATE_CONN") == "1"})
		if err != nil {
			b.Fatal(err)
		}
		ds[i] = d
		b.Cleanup(func() { _ = d.Close() })
	}
	return ds
}

// BenchmarkUncontended: acquire+release cycles on distinct keys, one key
// per client, the clients sharing one connection (DLOCKD_BENCH_PRIVATE_CONN=1:
// each its own). Besides cycles/s and CPU it reports the read and write
// system calls per cycle of the server and of the client (/proc's syscr +
// syscw), which shared connections cut (docs/BENCHMARKS-syscalls.md).
func BenchmarkUncontended(b *testing.B) {
	p := servertest.StartProcess(b, benchArgs()...)
	for _, clients := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			ds := dialN(b, p.Addr(), clients)
			var next atomic.Int64
			var failed atomic.Value
			b.ResetTimer()
			start := time.Now()
			srvCPU0, cliCPU0 := procCPU(b, p.PID()), selfCPU()
			srvIO0, cliIO0 := rwSyscalls(b, "/proc/"+strconv.Itoa(p.PID())+"/io"), rwSyscalls(b, "/proc/self/io")
			var wg sync.WaitGroup
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d := ds[c]
					ctx := context.Background()
					key := fmt.Sprintf("bench/uncontended/%d", c)
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						owner := fmt.Sprintf("owner-%d-%d-0123456789abcdef", c, i)
						if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: 30 * time.Second}); err != nil {
							failed.Store(err)
							return
						}
						if err := d.Release(ctx, key, owner); err != nil {
							failed.Store(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			if err, _ := failed.Load().(error); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/el.Seconds(), "cycles/s")
			b.ReportMetric(float64((procCPU(b, p.PID())-srvCPU0).Microseconds())/float64(b.N), "server-CPU-µs/cycle")
			b.ReportMetric(float64((selfCPU()-cliCPU0).Microseconds())/float64(b.N), "client-CPU-µs/cycle")
			b.ReportMetric(float64(rwSyscalls(b, "/proc/"+strconv.Itoa(p.PID())+"/io")-srvIO0)/float64(b.N), "server-rw-syscalls/cycle")
			b.ReportMetric(float64(rwSyscalls(b, "/proc/self/io")-cliIO0)/float64(b.N), "client-rw-syscalls/cycle")
		})
	}
}

// BenchmarkHandoff: waiters contend for one key; each holder releases at
// once. Reports handoffs/s and the gap from the release request being sent
// to the next holder hearing of its grant.
func BenchmarkHandoff(b *testing.B) {
	p := servertest.StartProcess(b, benchArgs()...)
	const waiters = 8
	ds := dialN(b, p.Addr(), waiters)
	var (
		mu          sync.Mutex
		lastRelease time.Time
		gaps        = make([]time.Duration, 0, b.N)
		done        atomic.Int64
		failed      atomic.Value
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := ds[w]
			for i := 0; ; i++ {
				if done.Load() >= int64(b.N) {
					return
				}
				owner := fmt.Sprintf("owner-%d-%d-0123456789abcdef", w, i)
				_, err := d.Wait(ctx, driver.AcquireRequest{Key: "bench/handoff", Owner: owner, TTL: 30 * time.Second})
				if err != nil {
					if ctx.Err() == nil {
						failed.Store(err)
						cancel()
					}
					return
				}
				now := time.Now()
				mu.Lock()
				if !lastRelease.IsZero() {
					gaps = append(gaps, now.Sub(lastRelease))
				}
				n := done.Add(1)
				lastRelease = time.Now()
				mu.Unlock()
				rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
				err = d.Release(rctx, "bench/handoff", owner)
				rcancel()
				if err != nil {
					failed.Store(err)
					cancel()
					return
				}
				if n >= int64(b.N) {
					cancel() // wake the others out of their waits
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(done.Load())/el.Seconds(), "handoffs/s")
	if len(gaps) > 0 {
		sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
		b.ReportMetric(float64(gaps[len(gaps)/2].Microseconds()), "gap-p50-µs")
		b.ReportMetric(float64(gaps[len(gaps)*99/100].Microseconds()), "gap-p99-µs")
	}
}

// BenchmarkMemory100kLeases: the server's RSS and Go heap with 100,000 held
// leases. The loop is not timed per op: each iteration fills and measures.
func BenchmarkMemory100kLeases(b *testing.B) {
	const leases, clients = 100_000, 32
	for range b.N {
		p := servertest.StartProcess(b, benchArgs()...)
		ds := dialN(b, p.Addr(), clients)
		var next atomic.Int64
		var failed atomic.Value
		var wg sync.WaitGroup
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := next.Add(1); i <= leases; i = next.Add(1) {
					req := driver.AcquireRequest{
						Key: fmt.Sprintf("bench/memory/%08d", i), Owner: fmt.Sprintf("%032x", i),
						TTL: time.Hour, Holder: "bench",
					}
					if _, err := ds[c].TryAcquire(context.Background(), req); err != nil {
						failed.Store(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			b.Fatal(err)
		}
		heap := scrape(b, p.Addr(), "go_memstats_heap_inuse_bytes")
		held := scrape(b, p.Addr(), "dlockd_held_leases")
		if held != leases {
			b.Fatalf("held %v leases, want %d", held, leases)
		}
		b.ReportMetric(float64(statusKiB(b, p.PID(), "VmRSS"))/1024, "RSS-MiB")
		b.ReportMetric(float64(statusKiB(b, p.PID(), "RssAnon"))/1024, "RSS-anon-MiB")
		b.ReportMetric(float64(statusKiB(b, p.PID(), "RssFile"))/1024, "RSS-file-MiB")
		b.ReportMetric(heap/(1<<20), "heap-inuse-MiB")
		idle := scrape(b, p.Addr(), "go_memstats_heap_idle_bytes") - scrape(b, p.Addr(), "go_memstats_heap_released_bytes")
		b.ReportMetric(idle/(1<<20), "heap-idle-unreleased-MiB")
		b.ReportMetric(scrape(b, p.Addr(), "go_memstats_sys_bytes")/(1<<20), "go-sys-MiB")
		smaps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", p.PID()))
		cur := ""
		agg := map[string]int{}
		for _, line := range strings.Split(string(smaps), "\n") {
			f := strings.Fields(line)
			if len(f) >= 5 && strings.Contains(f[0], "-") {
				cur = "[anon]"
				if len(f) >= 6 {
					cur = f[5]
				}
			} else if len(f) >= 2 && f[0] == "Rss:" {
				n, _ := strconv.Atoi(f[1])
				agg[cur] += n
			}
		}
		for k, v := range agg {
			if v > 1000 {
				b.Logf("rss %s: %d kB", k, v)
			}
		}
		if err := p.Kill(); err != nil {
			b.Fatal(err)
		}
	}
}

func scrape(b *testing.B, addr, name string) float64 {
	b.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			return f
		}
	}
	b.Fatalf("metric %s not found", name)
	return 0
}

// statusKiB reads one kB field of /proc/PID/status (VmRSS, RssAnon, ...).
func statusKiB(b *testing.B, pid int, field string) int {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("%s not found", field)
	return 0
}

// procCPU returns the user+system CPU time of process pid.
func procCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name (which ends with ')'): utime is the
	// 12th and stime the 13th of them, in clock ticks (100 per second).
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// rwSyscalls returns the read and write system calls (syscr + syscw) a
// process made so far, from its /proc/PID/io at path.
func rwSyscalls(b *testing.B, path string) int64 {
	b.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(string(data), "\n") {
		for _, f := range []string{"syscr: ", "syscw: "} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					b.Fatalf("%s: %q: %v", path, line, err)
				}
				n += x
			}
		}
	}
	return n
}

// selfCPU returns this process's user+system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
