// Package uitest drives dlockd's dashboard (/ui/) in a real headless
// browser: Debian's chromium, through github.com/chromedp/chromedp. The
// server is a real dlockd (servertest, on loopback ports, its data in a
// temporary directory) and the locks are taken through the real driver or
// the real gRPC API.
//
// The tests need /usr/bin/chromium (or $DLOCK_CHROMIUM): without it they
// fail with the install hint. DLOCK_UI_SCREENSHOT=path also writes the
// dashboard's screenshot there (docs/dashboard.png is made so, with some
// background traffic for the rates and histograms);
// DLOCK_UI_SCREENSHOT_DIR=dir writes every screenshot the tests take there.
package uitest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dlock-dev/dlock"
	_ "github.com/dlock-dev/dlock/drivers/dlockddriver"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server/servertest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	servertest.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// chromiumPath returns the browser to drive, or fails the test with the
// install hint.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("DLOCK_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"/usr/bin/chromium", "chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("uitest: chromium not found: install Debian's chromium (apt-get install chromium), or run make test-deps")
	return ""
}

// browser starts a headless chromium with a fresh profile and returns a
// tab's context, cancelled (and the browser ended) when the test ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless,
		chromedp.NoSandbox, // as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 1050),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// Start the browser now, so that its start-up is not counted in a
	// measured page load.
	// The first call starts the browser for the life of its context, so
	// it runs on ctx itself, bounded by a timer instead of a deadline.
	stuck := time.AfterFunc(30*time.Second, cancel)
	err := chromedp.Do(ctx, chromedp.Navigate("about:blank"))
	if !stuck.Stop() {
		t.Fatal("uitest: chromium did not start within 30s")
	}
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			t.Fatalf("uitest: %v: install Debian's chromium (apt-get install chromium), or run make test-deps", err)
		}
		t.Fatalf("uitest: start chromium: %v", err)
	}
	return ctx
}

// run runs actions with a timeout.
func run(t *testing.T, ctx context.Context, d time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := chromedp.Do(c, actions...); err != nil {
		t.Fatalf("uitest: %v", err)
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("uitest: evaluate %s: %v", expr, err)
	}
	return v
}

// waitJS polls the JavaScript condition cond (an expression) until it is
// true or within ends, and returns how long it took.
func waitJS(t *testing.T, ctx context.Context, within time.Duration, what, cond string) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	for {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := chromedp.Run(c, chromedp.Evaluate[bool]("!!("+cond+")"))
		cancel()
		if err == nil && ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			dump, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("keys-body") ? document.getElementById("keys-body").innerText + "\n---\n" + document.getElementById("queues").innerText + "\n---\n" + document.getElementById("banner").innerText : document.body.innerText`))
			t.Fatalf("uitest: %s: not true within %v (err %v); page shows:\n%s", what, within, err, dump)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// screenshot saves the page as name in the test's temp dir, and also at
// $DLOCK_UI_SCREENSHOT when set and save is true.
func screenshot(t *testing.T, ctx context.Context, name string, save bool) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(c, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("uitest: screenshot: %v", err)
	}
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", p, len(png))
	if d := os.Getenv("DLOCK_UI_SCREENSHOT_DIR"); d != "" { // every screenshot, to look at
		if err := os.WriteFile(filepath.Join(d, name), png, 0o644); err != nil {
			t.Fatalf("uitest: DLOCK_UI_SCREENSHOT_DIR: %v", err)
		}
	}
	if dst := os.Getenv("DLOCK_UI_SCREENSHOT"); dst != "" && save {
		if err := os.WriteFile(dst, png, 0o644); err != nil {
			t.Fatalf("uitest: DLOCK_UI_SCREENSHOT: %v", err)
		}
		t.Logf("screenshot also written to %s", dst)
	}
}

// js quotes s as a JavaScript string literal.
func js(s string) string { return strconv.Quote(s) }

// row is the selector expression of key's row.
func row(key string) string {
	return `document.querySelector('#keys-body tr[data-key=' + CSS.escape(` + js(key) + `) + ']')`
}

// cell is the text of column class c of key's row, or null.
func cell(key, c string) string {
	return `((` + row(key) + `||{querySelector:()=>null}).querySelector('.` + c + `')?.textContent ?? "")`
}

// waiter is the holder text of key's queue entry at pos, or undefined.
func waiter(key string, pos int) string {
	return `(document.querySelector('#queues li[data-key=' + CSS.escape(` + js(key) + `) + '][data-pos="` + strconv.Itoa(pos) + `"] .w-holder')?.textContent ?? "")`
}

// hostile is a key and a holder text that would run script if the page
// wrote them as HTML.
const (
	hostileKey    = `x:<script>window.__pwned=1</script>"'`
	hostileHolder = `<img src=x onerror="window.__pwned=2"> "quoted" & 'single' <b>bold</b>`
)

// TestDashboard_ShowsLocksQueuesAndFollowsRelease is the browser
// test: keys and queues taken through the driver appear on /ui/ with their
// fences, and a release shows within 2 s (the waiter becomes the holder
// with a greater fence; a released key with no waiter disappears). User
// text is shown as text, never run.
func TestDashboard_ShowsLocksQueuesAndFollowsRelease(t *testing.T) {
	ctx := browser(t)
	e := servertest.StartEmbedded(t, servertest.Config(t, t.TempDir()))
	addr := e.Addr()
	l, err := dlock.Open(t.Context(), "dlockd://"+addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })

	acq := func(key, holder string) *dlock.Lease {
		t.Helper()
		ls, err := l.Acquire(t.Context(), key, dlock.WithHolder(holder), dlock.WithTTL(30*time.Second))
		if err != nil {
			t.Fatalf("acquire %q: %v", key, err)
		}
		t.Cleanup(func() { _ = ls.Release(context.Background()) })
		return ls
	}
	payout := acq("payout:42", "payout-worker-7 (pid 4121 on app-3)")
	report := acq("reports:daily", "report-cron on batch-1")
	acq("orders:1001", "checkout-api/2 (pid 88)")
	evil := acq(hostileKey, hostileHolder)

	// Two waiters on payout:42, queued in order A then B.
	var wg sync.WaitGroup
	waiters := make(chan *dlock.Lease, 2)
	wctx, stopWaiters := context.WithCancel(t.Context())
	t.Cleanup(func() { stopWaiters(); wg.Wait() })
	queueLen := func() int {
		h, err := l.Inspect(t.Context(), "payout:42")
		if err != nil {
			t.Fatal(err)
		}
		return h.Waiters
	}
	for i, name := range []string{"waiter-A (settle job)", "waiter-B (settle job)"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ls, err := l.Acquire(wctx, "payout:42", dlock.WithHolder(name), dlock.WithTTL(30*time.Second))
			if err == nil {
				waiters <- ls
			}
		}()
		deadline := time.Now().Add(10 * time.Second)
		for queueLen() < i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d not queued within 10s", i+1)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	var screenshotChurn func()
	if os.Getenv("DLOCK_UI_SCREENSHOT") != "" {
		screenshotChurn = churn(t, l) // some traffic, so that the rates and histograms have something to show
	}

	run(t, ctx, 20*time.Second, chromedp.Navigate("http://"+addr+"/ui/"))
	waitJS(t, ctx, 5*time.Second, "payout:42 row", row("payout:42"))

	// Fences and holders, as the driver was told.
	for _, c := range []struct {
		ls     *dlock.Lease
		holder string
	}{{payout, "payout-worker-7 (pid 4121 on app-3)"}, {report, "report-cron on batch-1"}, {evil, hostileHolder}} {
		fence := eval[string](t, ctx, cell(c.ls.Key(), "c-fence"))
		holder := eval[string](t, ctx, cell(c.ls.Key(), "c-holder"))
		if fence != strconv.FormatUint(c.ls.Fence(), 10) || holder != c.holder {
			t.Errorf("row %q: fence %q holder %q; want %d, %q", c.ls.Key(), fence, holder, c.ls.Fence(), c.holder)
		}
	}
	// The queue, head first.
	waitJS(t, ctx, 3*time.Second, "queue of payout:42", waiter("payout:42", 2))
	a := eval[string](t, ctx, waiter("payout:42", 1))
	b := eval[string](t, ctx, waiter("payout:42", 2))
	if a != "waiter-A (settle job)" || b != "waiter-B (settle job)" {
		t.Errorf("queue of payout:42: %q, %q; want waiter-A then waiter-B", a, b)
	}
	qcount := eval[string](t, ctx, cell("payout:42", "c-queue"))
	if qcount != "2" {
		t.Errorf("queue column of payout:42: %q, want 2", qcount)
	}
	// The hostile key and holder are text: shown whole, nothing ran, no
	// element came from them.
	key := eval[string](t, ctx, cell(hostileKey, "c-key"))
	pwned := eval[bool](t, ctx, `window.__pwned !== undefined`)
	scripts := eval[int](t, ctx, `document.scripts.length`)
	imgs := eval[int](t, ctx, `document.querySelectorAll('img, b').length`)
	if key != hostileKey || pwned || scripts != 1 || imgs != 0 {
		t.Errorf("hostile text: key cell %q, script ran %v, %d scripts, %d img/b elements; want the text whole, nothing run, 1 script, 0 elements", key, pwned, scripts, imgs)
	}
	// Raft state.
	waitJS(t, ctx, 3*time.Second, "Raft members", `document.querySelector('#members-body tr.leader')`)
	if err := evil.Release(t.Context()); err != nil { // (not in the screenshot)
		t.Fatal(err)
	}
	waitJS(t, ctx, 2*time.Second, "hostile key gone", `!`+row(hostileKey))

	if screenshotChurn != nil {
		waitJS(t, ctx, 8*time.Second, "hold-time histogram", `!document.getElementById('hold-meta').textContent.startsWith('no ')`)
		time.Sleep(6 * time.Second) // polls enough for the rates and sparklines
		screenshot(t, ctx, "dashboard.png", true)
		screenshotChurn()
	}

	// A release hands payout:42 to waiter A (greater fence) within 2 s,
	// and the queue shrinks to B.
	if err := payout.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	waitJS(t, ctx, 2*time.Second, "payout:42 handed to waiter-A",
		cell("payout:42", "c-holder")+` === "waiter-A (settle job)" && Number(`+cell("payout:42", "c-fence")+`) > `+strconv.FormatUint(payout.Fence(), 10)+
			` && `+waiter("payout:42", 1)+` === "waiter-B (settle job)" && !(`+waiter("payout:42", 2)+`)`)
	t.Logf("handover shown %v after the release", time.Since(released).Round(time.Millisecond))
	var got *dlock.Lease
	select {
	case got = <-waiters:
	case <-time.After(5 * time.Second):
		t.Fatal("waiter A not granted")
	}
	fence := eval[string](t, ctx, cell("payout:42", "c-fence"))
	if fence != strconv.FormatUint(got.Fence(), 10) {
		t.Errorf("payout:42 fence on the page %s, the driver's grant %d", fence, got.Fence())
	}

	// A released key with nobody waiting disappears within 2 s.
	if err := report.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	released = time.Now()
	waitJS(t, ctx, 2*time.Second, "reports:daily gone", `!`+row("reports:daily"))
	t.Logf("release shown %v after it", time.Since(released).Round(time.Millisecond))
	screenshot(t, ctx, "after-release.png", false)
	_ = got.Release(t.Context())

	// A lease that expires while held raises the correctness alarm.
	resp, err := http.Post("http://"+addr+"/v1/acquire", "application/json", strings.NewReader(`{"key":"cron:nightly","owner":"crashed-holder-0001","holder":"nightly job (crashed)","ttl":"0.3s"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("acquire cron:nightly: %s", resp.Status)
	}
	took := waitJS(t, ctx, 5*time.Second, "correctness alarm", `!document.getElementById('alarm').hidden && document.getElementById('card-expired').classList.contains('hot') && document.getElementById('alarm-text').textContent.startsWith('1 lease expired')`)
	t.Logf("expiry alarm shown %v after the acquisition of a 0.3 s lease", took.Round(time.Millisecond))
	screenshot(t, ctx, "alarm.png", false)
}

// churn takes and releases short leases in the background (for the
// screenshot's rates and histograms) until the returned stop is called.
func churn(t *testing.T, l *dlock.Locker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	holders := []string{"billing-worker-1", "billing-worker-2", "ledger-sync on db-2", "invoice-render/3", "search-indexer", "mailer (pid 731)"}
	// Some steady holders, so that the table has more than a few rows.
	var keep []*dlock.Lease
	for i := range 14 {
		ls, err := l.Acquire(ctx, fmt.Sprintf("jobs:%04d", 1000+i*37), dlock.WithHolder(holders[i%len(holders)]), dlock.WithTTL(time.Duration(20+i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		keep = append(keep, ls)
		time.Sleep(40 * time.Millisecond)
	}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil && i < 400; i++ {
				key := fmt.Sprintf("tasks:%d", (w*7+i)%5)
				ls, err := l.Acquire(ctx, key, dlock.WithHolder(holders[(w+i)%len(holders)]), dlock.WithTTL(10*time.Second))
				if err != nil {
					return
				}
				select {
				case <-time.After(time.Duration(5+(i*37+w*11)%120) * time.Millisecond):
				case <-ctx.Done():
				}
				_ = ls.Release(context.Background())
			}
		}()
	}
	return func() {
		cancel()
		wg.Wait()
		for _, ls := range keep {
			_ = ls.Release(context.Background())
		}
	}
}

// TestDashboard_FirstPageOf100kKeys fills the table with 100,000 held keys
// (pipelined acquisitions on Session streams of the real gRPC API) and
// measures, in the browser, the time from navigation to the first page of
// keys on screen: under 1 s, as the page is read from the ordered index
// whatever the table's size.
func TestDashboard_FirstPageOf100kKeys(t *testing.T) {
	const n = 100_000
	ctx := browser(t)
	cfg := servertest.Config(t, t.TempDir())
	cfg.NoSync = true // filling the table is not what is measured
	e := servertest.StartEmbedded(t, cfg)
	addr := e.Addr()

	start := time.Now()
	fill(t, addr, n)
	t.Logf("%d keys acquired in %v", n, time.Since(start).Round(time.Millisecond))

	for i := range 3 {
		run(t, ctx, 20*time.Second, chromedp.Navigate("about:blank"))
		run(t, ctx, 20*time.Second, chromedp.Navigate("http://"+addr+"/ui/"))
		waitJS(t, ctx, 10*time.Second, "first page of keys", `window.dlockFirstRowsMs`)
		ms := eval[float64](t, ctx, `window.dlockFirstRowsMs`)
		rows := eval[int](t, ctx, `document.querySelectorAll('#keys-body tr').length`)
		count := eval[string](t, ctx, `document.getElementById('keys-count').textContent`)
		fetchMs := eval[float64](t, ctx, `performance.getEntriesByType("resource").find((e) => e.name.includes("/ui/api/locks"))?.duration ?? -1`)
		t.Logf("load %d: first page of keys (%d rows) rendered %.0f ms after navigation start (its /ui/api/locks fetch: %.0f ms); header: %s", i+1, rows, ms, fetchMs, count)
		if rows != 50 || !strings.HasPrefix(count, "100,000 held") {
			t.Errorf("first page: %d rows, count %q; want 50 rows of 100,000 held", rows, count)
		}
		if ms >= 1000 {
			t.Errorf("first page of %d keys rendered after %.0f ms, want < 1000 ms", n, ms)
		}
	}
	// Paging and filtering stay fast too.
	run(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS("#next")))
	waitJS(t, ctx, 2*time.Second, "page 2", `document.getElementById('page-info').textContent.startsWith('page 2')`)
	t0 := time.Now()
	eval[string](t, ctx, `location.hash = "prefix=k:07777"`)
	waitJS(t, ctx, 2*time.Second, "filtered page", `document.querySelectorAll('#keys-body tr').length === 10 && `+row("k:077770"))
	t.Logf("prefix filter k:07777 shown in %v", time.Since(t0).Round(time.Millisecond))
}

// fill acquires keys k:000000 .. k:(n-1) with long TTLs over 4 pipelined
// Session streams.
func fill(t *testing.T, addr string, n int) {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := dlockv1.NewLockClient(cc)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const streams = 4
	errs := make(chan error, streams)
	for s := range streams {
		go func() {
			errs <- func() error {
				st, err := c.Session(ctx)
				if err != nil {
					return err
				}
				sent := make(chan error, 1)
				go func() {
					for i := s; i < n; i += streams {
						req := &dlockv1.SessionRequest{Id: uint64(i + 1), Call: &dlockv1.SessionRequest_Acquire{Acquire: &dlockv1.AcquireRequest{
							Key: fmt.Sprintf("k:%06d", i), Owner: fmt.Sprintf("owner-%06d-0123456789abcdef", i),
							Holder: fmt.Sprintf("loadgen-%d", i%16), Ttl: durationpb.New(30 * time.Minute),
						}}}
						if err := st.Send(req); err != nil {
							sent <- err
							return
						}
					}
					sent <- st.CloseSend()
				}()
				for got := 0; got < (n-s+streams-1)/streams; got++ {
					r, err := st.Recv()
					if err != nil {
						return fmt.Errorf("session %d after %d answers: %w", s, got, err)
					}
					if r.GetCode() != 0 {
						return fmt.Errorf("session %d: call %d: code %d: %s", s, r.GetId(), r.GetCode(), r.GetMessage())
					}
				}
				return <-sent
			}()
		}()
	}
	for range streams {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestDashboard_TokenPromptAndReadFilter: with an auth file, the page asks
// for a token when the API answers 401, refuses a wrong one, and with a
// token that may read only "a:" shows only the a: keys.
func TestDashboard_TokenPromptAndReadFilter(t *testing.T) {
	ctx := browser(t)
	dir := t.TempDir()
	ids := []servertest.Identity{
		{Name: "ops", Rules: map[string][]string{"": {"lock", "admin"}}},
		{Name: "reader-a", Rules: map[string][]string{"a:": {"read"}}},
	}
	cfg := servertest.Config(t, filepath.Join(dir, "data"))
	cfg.AuthFile = servertest.WriteAuthFile(t, dir, ids)
	e := servertest.StartEmbedded(t, cfg)
	addr := e.Addr()
	tokenFile := filepath.Join(dir, "ops.token")
	if err := os.WriteFile(tokenFile, []byte(ids[0].Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := dlock.Open(t.Context(), "dlockd://"+addr+"?token_file="+url.QueryEscape(tokenFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	for _, k := range []string{"a:1", "a:2", "b:1", "b:2"} {
		ls, err := l.Acquire(t.Context(), k, dlock.WithHolder("holder of "+k), dlock.WithTTL(30*time.Second))
		if err != nil {
			t.Fatalf("acquire %s: %v", k, err)
		}
		t.Cleanup(func() { _ = ls.Release(context.Background()) })
	}

	run(t, ctx, 20*time.Second, chromedp.Navigate("http://"+addr+"/ui/"))
	waitJS(t, ctx, 5*time.Second, "token prompt", `!document.getElementById('auth').hidden`)
	screenshot(t, ctx, "token-prompt.png", false)
	if n := eval[int](t, ctx, `document.querySelectorAll('#keys-body tr').length`); n != 0 {
		t.Errorf("%d key rows shown without a token", n)
	}
	// A wrong token is refused, and the prompt says so.
	run(t, ctx, 10*time.Second,
		chromedp.SendKeys(chromedp.CSS("#token"), "dlk_not-a-known-token"),
		chromedp.Click(chromedp.CSS(`#auth-form button[type=submit]`)))
	waitJS(t, ctx, 5*time.Second, "refusal shown", `!document.getElementById('auth').hidden && document.getElementById('auth-error').textContent.includes('refused')`)
	// The reader's token: only a: keys.
	run(t, ctx, 10*time.Second,
		chromedp.SendKeys(chromedp.CSS("#token"), ids[1].Token),
		chromedp.Click(chromedp.CSS(`#auth-form button[type=submit]`)))
	waitJS(t, ctx, 5*time.Second, "a: keys", row("a:1")+` && `+row("a:2"))
	keys := eval[[]string](t, ctx, `[...document.querySelectorAll('#keys-body tr')].map((r) => r.dataset.key)`)
	if strings.Join(keys, ",") != "a:1,a:2" {
		t.Errorf("keys shown with the a: reader's token: %v; want a:1, a:2", keys)
	}
	if hidden := eval[bool](t, ctx, `document.getElementById('auth').hidden && !document.getElementById('filtered-note').hidden`); !hidden {
		t.Error("want the prompt gone and the note that some keys are hidden")
	}
	if tok := eval[string](t, ctx, `sessionStorage.getItem("dlock.token")`); tok != ids[1].Token {
		t.Error("the token is not kept in sessionStorage")
	}
	screenshot(t, ctx, "reader-a.png", false)
}
