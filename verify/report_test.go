package verify

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"
)

const evilKey = `k<script>alert("x")</script>`

// reportResults builds two results by hand: a clean run and one with a
// double grant (clients 1 and 2 on evilKey), a refused write and a fault
// span.
func reportResults() []*Result {
	s := time.Second
	clean := &Result{
		Store: "memory", Faults: "", Duration: 10 * s, Clients: 2, Keys: 2, TTL: s, Seed: 42,
		Findings: &Findings{Recovery: -1, LongestGap: 0, Linearizable: "ok", WritesAccepted: 4, Grants: 3},
		History: &History{
			End: 10 * s,
			Holds: []Hold{
				{Client: 0, Key: "a", Owner: "o0", Fence: 1, Granted: 1 * s, LastAct: 2 * s, Ended: 2500 * time.Millisecond, EndReason: "released"},
				{Client: 1, Key: "a", Owner: "o1", Fence: 2, Granted: 3 * s, LastAct: 4 * s, Ended: 4 * s, EndReason: "released"},
				{Client: 0, Key: "b", Owner: "o2", Fence: 1, Granted: 5 * s, LastAct: 6 * s, Ended: 6 * s, EndReason: "released"},
			},
			Writes: []Write{
				{Client: 0, Key: "a", Owner: "o0", Fence: 1, Invoke: 1500 * time.Millisecond, Complete: 1510 * time.Millisecond, Accepted: true},
				{Client: 0, Key: "a", Owner: "o0", Fence: 1, Invoke: 2 * s, Complete: 2010 * time.Millisecond, Accepted: true},
				{Client: 1, Key: "a", Owner: "o1", Fence: 2, Invoke: 3500 * time.Millisecond, Complete: 3510 * time.Millisecond, Accepted: true},
				{Client: 0, Key: "b", Owner: "o2", Fence: 1, Invoke: 5500 * time.Millisecond, Complete: 5510 * time.Millisecond, Accepted: true},
			},
		},
	}
	faulty := &Result{
		Store: "redis", Faults: "pause", Duration: 10 * s, Clients: 3, Keys: 1, TTL: s, Seed: 7,
		Findings: &Findings{
			DoubleGrants: 1, EarlyGrants: 0, StaleWritesRefused: 1, FailedDuringFault: 3,
			LongestGap: 2345 * time.Millisecond, Recovery: 1500 * time.Millisecond, Linearizable: "ok",
			Violations: []string{fmt.Sprintf("double grant on %q: client 1 wrote after client 2 was granted", evilKey)},
		},
		Visualization: "/tmp/run/linearizability.html",
		History: &History{
			End:    10 * s,
			Faults: []FaultSpan{{Name: "pause", Start: 2 * s, End: 6 * s, Note: "client 1"}},
			Holds: []Hold{
				{Client: 0, Key: evilKey, Owner: "p0", Fence: 1, Granted: 500 * time.Millisecond, LastAct: 1 * s, Ended: 1 * s, EndReason: "released"},
				// Client 1 is paused holding fence 2 and writes at 5 s,
				// after client 2 was granted fence 3 at 4 s.
				{Client: 1, Key: evilKey, Owner: "p1", Fence: 2, Granted: 2 * s, LastAct: 5 * s, Ended: 5100 * time.Millisecond, EndReason: "lost", Fault: "pause 1.5x"},
				{Client: 2, Key: evilKey, Owner: "p2", Fence: 3, Granted: 4 * s, LastAct: 4500 * time.Millisecond, Ended: 7 * s, EndReason: "released"},
			},
			Writes: []Write{
				{Client: 0, Key: evilKey, Owner: "p0", Fence: 1, Invoke: 1 * s, Complete: 1010 * time.Millisecond, Accepted: true},
				{Client: 2, Key: evilKey, Owner: "p2", Fence: 3, Invoke: 4500 * time.Millisecond, Complete: 4510 * time.Millisecond, Accepted: true},
				{Client: 1, Key: evilKey, Owner: "p1", Fence: 2, Invoke: 5 * s, Complete: 5010 * time.Millisecond, Refused: true},
			},
		},
	}
	return []*Result{clean, faulty}
}

func renderReport(t *testing.T, results []*Result) string {
	t.Helper()
	var b bytes.Buffer
	if err := WriteHTML(&b, `dlock <verify> & "report"`, results); err != nil {
		t.Fatal(err)
	}
	if p := os.Getenv("VERIFY_REPORT_OUT"); p != "" {
		os.WriteFile(p, b.Bytes(), 0o644)
	}
	return b.String()
}

// byID finds the element with id; hasClass tests a class attribute.
func byID(n *html.Node, id string) *html.Node {
	if n.Type == html.ElementNode && attr(n, "id") == id {
		return n
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		if f := byID(c, id); f != nil {
			return f
		}
	}
	return nil
}

func attr(n *html.Node, name string) string {
	for _, a := range n.Attr {
		if a.Key == name {
			return a.Val
		}
	}
	return ""
}

func hasClass(n *html.Node, class string) bool {
	return n.Type == html.ElementNode && strings.Contains(" "+attr(n, "class")+" ", " "+class+" ")
}

func findAll(n *html.Node, pred func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if pred(n) {
			out = append(out, n)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return out
}

func countClass(n *html.Node, class string) int {
	return len(findAll(n, func(n *html.Node) bool { return hasClass(n, class) }))
}

func text(n *html.Node) string {
	var b strings.Builder
	for _, t := range findAll(n, func(n *html.Node) bool { return n.Type == html.TextNode }) {
		b.WriteString(t.Data)
	}
	return strings.TrimSpace(b.String())
}

// checkBalanced tokenizes the page and checks every element that is not
// void or self-closed is closed, in order: the page is well-formed.
func checkBalanced(t *testing.T, page string) {
	t.Helper()
	void := map[string]bool{"meta": true, "br": true, "hr": true, "img": true, "input": true, "link": true}
	z := html.NewTokenizer(strings.NewReader(page))
	var stack []string
	for {
		tt := z.Next()
		switch tt {
		case html.ErrorToken:
			if z.Err() != io.EOF {
				t.Fatalf("tokenizer: %v", z.Err())
			}
			if len(stack) > 0 {
				t.Fatalf("unclosed elements at the end: %v", stack)
			}
			return
		case html.StartTagToken:
			name, _ := z.TagName()
			if !void[string(name)] {
				stack = append(stack, string(name))
			}
		case html.EndTagToken:
			name, _ := z.TagName()
			if len(stack) == 0 || stack[len(stack)-1] != string(name) {
				t.Fatalf("</%s> closes %v", name, stack)
			}
			stack = stack[:len(stack)-1]
		}
	}
}

func TestReportHTML(t *testing.T) {
	page := renderReport(t, reportResults())
	checkBalanced(t, page)
	for _, ext := range []string{"<script", "<link", "@import", "src=", "http://", "https://"} {
		if strings.Contains(strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, ""), ext) {
			t.Errorf("page is not self-contained: it contains %q", ext)
		}
	}
	if !strings.Contains(page, "k&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") {
		t.Error("the key with <script> is not escaped as expected")
	}
	if !strings.Contains(page, "<title>dlock &lt;verify&gt; &amp; &#34;report&#34;</title>") {
		t.Error("the title is not escaped in <title>")
	}

	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}

	// Summary table: one row per result, the right counts, linked.
	rows := findAll(doc, func(n *html.Node) bool { return n.Data == "tr" && hasClass(n, "result") })
	if len(rows) != 2 {
		t.Fatalf("summary rows = %d, want 2", len(rows))
	}
	cell := func(row *html.Node, class string) string {
		cs := findAll(row, func(n *html.Node) bool { return n.Data == "td" && hasClass(n, class) })
		if len(cs) != 1 {
			t.Fatalf("row has %d cells of class %q", len(cs), class)
		}
		return text(cs[0])
	}
	want := []map[string]string{
		{"dg": "0 (0)", "fv": "0", "swa": "0", "swr": "0", "fdf": "0", "gap": "0.0", "rec": "none", "lin": "ok", "seed": "42"},
		{"dg": "1 (0)", "fv": "0", "swa": "0", "swr": "1", "fdf": "3", "gap": "2.3", "rec": "1.5", "lin": "ok", "seed": "7"},
	}
	for i, row := range rows {
		for class, w := range want[i] {
			if got := cell(row, class); got != w {
				t.Errorf("row %d: %s = %q, want %q", i, class, got, w)
			}
		}
		links := findAll(row, func(n *html.Node) bool { return n.Data == "a" })
		if len(links) == 0 || attr(links[0], "href") != fmt.Sprintf("#run-%d", i) {
			t.Errorf("row %d does not link to #run-%d", i, i)
		}
		if hasClass(row, "unsafe") {
			t.Errorf("row %d is marked unsafe", i)
		}
	}

	// Sections: bars, faults, writes, violations.
	s0, s1 := byID(doc, "run-0"), byID(doc, "run-1")
	if s0 == nil || s1 == nil {
		t.Fatal("missing a section run-0 or run-1")
	}
	for _, c := range []struct {
		class  string
		n0, n1 int
	}{
		{"hold-bar", 3, 3},
		{"faulted", 0, 1},
		{"hatch", 0, 1},
		{"fault-span", 0, 1},
		{"w-ok", 4, 2},
		{"w-refused", 0, 1},
		{"w-stale", 0, 0},
		{"violation-marker", 0, 1},
		{"violation", 0, 1},
	} {
		if got := countClass(s0, c.class); got != c.n0 {
			t.Errorf("section 0: %d elements of class %q, want %d", got, c.class, c.n0)
		}
		if got := countClass(s1, c.class); got != c.n1 {
			t.Errorf("section 1: %d elements of class %q, want %d", got, c.class, c.n1)
		}
	}
	// One row per client, a fault name on top, the violation described.
	if got := len(findAll(s1, func(n *html.Node) bool {
		return n.Data == "rect" && (hasClass(n, "row-odd") || hasClass(n, "row-even"))
	})); got != 3 {
		t.Errorf("section 1: %d client rows, want 3", got)
	}
	if names := findAll(s1, func(n *html.Node) bool { return hasClass(n, "fault-name") }); len(names) != 1 || text(names[0]) != "pause" {
		t.Errorf("section 1: fault names %v", names)
	}
	if lis := findAll(s1, func(n *html.Node) bool { return n.Data == "li" }); len(lis) != 1 || !strings.Contains(text(lis[0]), "<script>") {
		t.Errorf("section 1: violations list %d items", len(lis))
	}
	if !strings.Contains(text(s1), "/tmp/run/linearizability.html") || strings.Contains(text(s0), "linearizability.html") {
		t.Error("the visualisation note is not only in section 1")
	}
	// The marker spans clients 1 and 2 at b's grant (4 s of 10 s).
	m := findAll(s1, func(n *html.Node) bool { return n.Data == "line" && hasClass(n, "violation") })[0]
	if x := attr(m, "x1"); x != px(plotLeft+0.4*(plotRight-plotLeft)).String() {
		t.Errorf("violation marker at x=%s", x)
	}
	if y1, y2 := attr(m, "y1"), attr(m, "y2"); y1 != px(plotTop+1*rowHeight+1).String() || y2 != px(plotTop+3*rowHeight-1).String() {
		t.Errorf("violation marker spans y %s..%s, want rows 1..2", y1, y2)
	}
	// The faulted hold's tooltip names key (escaped), fence, fault, end.
	tips := findAll(s1, func(n *html.Node) bool { return hasClass(n, "faulted") })
	if tip := text(tips[0]); !strings.Contains(tip, "fence 2") || !strings.Contains(tip, "pause 1.5x") || !strings.Contains(tip, "end: lost") || !strings.Contains(tip, "<script>") {
		t.Errorf("faulted hold tooltip = %q", tip)
	}
}

// TestReportStaleAndSampling: a stale write accepted is marked red, and a
// history of more than 5,000 writes has its accepted ticks sampled but
// every refused one drawn.
func TestReportStaleAndSampling(t *testing.T) {
	h := &History{End: 10 * time.Second}
	h.Holds = []Hold{{Client: 0, Key: "k", Owner: "a", Fence: 5, Granted: 0, LastAct: time.Second}}
	h.Writes = append(h.Writes,
		Write{Client: 0, Key: "k", Owner: "a", Fence: 5, Invoke: 100, Complete: 200, Accepted: true},
		Write{Client: 1, Key: "k", Owner: "b", Fence: 4, Invoke: 300, Complete: 400, Accepted: true}, // stale
	)
	for i := range 12000 {
		w := Write{Client: i % 2, Key: "k", Owner: "a", Fence: 5, Invoke: time.Duration(1000 + i), Complete: time.Duration(1001 + i), Accepted: true}
		if i%1000 == 0 {
			w.Accepted, w.Refused = false, true
		}
		h.Writes = append(h.Writes, w)
	}
	page := renderReport(t, []*Result{{Store: "s", History: h, Findings: &Findings{Recovery: -1, StaleWritesAccepted: 1}}})
	checkBalanced(t, page)
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if got := countClass(doc, "w-stale"); got != 1 {
		t.Errorf("stale ticks = %d, want 1", got)
	}
	if got := countClass(doc, "w-refused"); got != 12 {
		t.Errorf("refused ticks = %d, want 12 (all)", got)
	}
	// 12,002 writes: k = 3; the 11,989 ordinary ones drawn every 3rd.
	if got, want := countClass(doc, "w-ok"), (11989+2)/3; got != want {
		t.Errorf("accepted ticks = %d, want %d", got, want)
	}
	if !strings.Contains(page, "only one in 3 accepted or failed writes is drawn") {
		t.Error("the caption does not say the writes were sampled")
	}
	if !strings.Contains(page, `<td class="rec">none</td>`) {
		t.Error("recovery -1 is not shown as none")
	}
}
