package verify

import (
	"bytes"
	"cmp"
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strconv"
	"time"
)

// WriteHTML writes one self-contained HTML page (no external script, style
// sheet or font) describing results: a summary table with a row per
// result, then per result an SVG timeline of its history (a row per
// client, a bar per hold coloured by key, the fault spans shaded, the
// register writes as ticks, double grants and stale writes accepted in
// red) and the violations the checkers described. Every string from the
// results is escaped (html/template). Nil results are skipped; anchors are
// derived from the index in results ("run-0", "run-1", ...).
func WriteHTML(w io.Writer, title string, results []*Result) error {
	page := reportPage{Title: title}
	for i, r := range results {
		if r == nil {
			continue
		}
		anchor := "run-" + strconv.Itoa(i)
		page.Rows = append(page.Rows, summarize(i, anchor, r))
		page.Sections = append(page.Sections, buildSection(i, anchor, r))
	}
	var b bytes.Buffer
	if err := reportTemplate.Execute(&b, page); err != nil {
		return fmt.Errorf("verify: report: %w", err)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// Timeline geometry: the SVG is reportWidth wide, rowHeight per client row.
const (
	reportWidth   = 1100
	rowHeight     = 22
	plotLeft      = 76
	plotRight     = reportWidth - 14
	plotTop       = 38
	axisHeight    = 34
	maxRows       = 256  // client rows drawn at most
	maxWriteTicks = 5000 // above this many writes, accepted ticks are sampled
	maxMarkers    = 1000 // double-grant markers drawn at most
)

// palette colours holds by key index (sorted key order), cyclically. The
// same colours are in the page's style sheet as classes k0..k7 (SVG fill)
// and s0..s7 (legend swatches).
var palette = []string{"#4e79a7", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#9c755f", "#bab0ac", "#86bcb6"}

// px is an SVG coordinate, printed with one decimal.
type px float64

func (p px) String() string { return strconv.FormatFloat(float64(p), 'f', 1, 64) }

type reportPage struct {
	Title    string
	Rows     []summaryRow
	Sections []section
}

type summaryRow struct {
	Anchor        string
	Index         int
	Store, Faults string
	F             *Findings
	Unsafe        bool
	LongestGap    string
	Recovery      string
	Seed          uint64
}

type section struct {
	Anchor        string
	Index         int
	Store, Faults string
	Meta          string
	Timeline      *timeline
	Violations    []string
	Truncated     bool
	HasFindings   bool
	Visualization string
}

type timeline struct {
	ID                    string
	Width, Height         px
	Left, Right, Top, Bot px
	Rows                  []rowLabel
	Ticks                 []axisTick
	Faults                []faultRect
	Holds                 []holdBar
	Writes                []writeTick
	Markers               []marker
	Keys                  []legendKey
	Caption               []string
}

type rowLabel struct {
	Y, LabelY px
	Label     string
	Odd       bool
}

type axisTick struct {
	X     px
	Label string
}

type faultRect struct {
	X, W, Y, H     px
	LabelX, LabelY px
	Name, Tip      string
}

type holdBar struct {
	X, Y, W, H px
	Color      int
	Faulted    bool
	Tip        string
}

type writeTick struct {
	X, Y1, Y2 px
	Class     string
	Tip       string
}

type marker struct {
	X, Y1, Y2 px
	Tip       string
}

type legendKey struct {
	Color int
	Key   string
}

// PlotWidth, RowHeight, TickEnd and TickLabelY are for the template.
func (t *timeline) PlotWidth() px  { return t.Right - t.Left }
func (t *timeline) RowHeight() px  { return rowHeight }
func (t *timeline) TickEnd() px    { return t.Bot + 5 }
func (t *timeline) TickLabelY() px { return t.Bot + 18 }

func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) }

func secondsMs(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 3, 64) + "s" }

func summarize(i int, anchor string, r *Result) summaryRow {
	row := summaryRow{Anchor: anchor, Index: i, Store: r.Store, Faults: r.Faults, F: r.Findings, Seed: r.Seed}
	if row.Faults == "" {
		row.Faults = "none"
	}
	if f := r.Findings; f != nil {
		row.Unsafe = f.Unsafe()
		row.LongestGap = seconds(f.LongestGap)
		row.Recovery = "none"
		if f.Recovery >= 0 {
			row.Recovery = seconds(f.Recovery)
		}
	}
	return row
}

func buildSection(i int, anchor string, r *Result) section {
	s := section{Anchor: anchor, Index: i, Store: r.Store, Faults: r.Faults, Visualization: r.Visualization}
	if s.Faults == "" {
		s.Faults = "none"
	}
	s.Meta = fmt.Sprintf("%d clients, %d keys, TTL %v, duration %v, seed %d", r.Clients, r.Keys, r.TTL, r.Duration, r.Seed)
	if f := r.Findings; f != nil {
		s.HasFindings = true
		s.Violations = f.Violations
		if len(s.Violations) > maxDescribed {
			s.Violations = s.Violations[:maxDescribed]
		}
		s.Truncated = len(s.Violations) == maxDescribed
	}
	if r.History != nil {
		s.Timeline = buildTimeline(anchor, r.History)
	}
	return s
}

func buildTimeline(id string, h *History) *timeline {
	end := h.End
	if end <= 0 {
		for _, x := range h.Holds {
			end = max(end, x.Granted, x.LastAct, x.Ended)
		}
		for _, x := range h.Writes {
			end = max(end, x.Complete)
		}
		for _, x := range h.Faults {
			end = max(end, x.End)
		}
		if end <= 0 {
			end = time.Second
		}
	}
	rows := 0
	for _, x := range h.Holds {
		rows = max(rows, x.Client+1)
	}
	for _, x := range h.Writes {
		rows = max(rows, x.Client+1)
	}
	dropped := rows > maxRows
	rows = min(max(rows, 1), maxRows)

	t := &timeline{ID: id, Left: plotLeft, Right: plotRight, Top: plotTop}
	t.Bot = px(plotTop + rows*rowHeight)
	t.Width = reportWidth
	t.Height = t.Bot + axisHeight
	plotW := float64(plotRight - plotLeft)
	xOf := func(d time.Duration) px {
		f := float64(d) / float64(end)
		return px(float64(plotLeft) + min(max(f, 0), 1)*plotW)
	}
	rowY := func(c int) px { return px(plotTop + c*rowHeight) }
	inRows := func(c int) bool { return c >= 0 && c < rows }

	for c := range rows {
		t.Rows = append(t.Rows, rowLabel{Y: rowY(c), LabelY: rowY(c) + rowHeight/2 + 4, Label: "client " + strconv.Itoa(c), Odd: c%2 == 1})
	}
	t.Ticks = axisTicks(end, xOf)

	// Fault spans: shaded over every row, the name above; an unhealed
	// span (End 0) lasts to the end.
	for i, f := range h.Faults {
		fe := f.End
		if fe < f.Start {
			fe = end
		}
		x0, x1 := xOf(f.Start), xOf(fe)
		tip := fmt.Sprintf("%s: %s – %s", f.Name, secondsMs(f.Start), secondsMs(fe))
		if f.Note != "" {
			tip += " (" + f.Note + ")"
		}
		t.Faults = append(t.Faults, faultRect{
			X: x0, W: max(x1-x0, 1), Y: plotTop, H: t.Bot - plotTop,
			LabelX: x0 + 2, LabelY: px(plotTop - 6 - 12*(i%2)), Name: f.Name, Tip: tip,
		})
	}

	// Keys in sorted order give the colours.
	var keys []string
	for _, x := range h.Holds {
		keys = append(keys, x.Key)
	}
	for _, x := range h.Writes {
		keys = append(keys, x.Key)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	color := map[string]int{}
	for i, k := range keys {
		color[k] = i % len(palette)
		t.Keys = append(t.Keys, legendKey{Color: i % len(palette), Key: k})
	}

	for _, x := range h.Holds {
		if !inRows(x.Client) {
			continue
		}
		stop := max(x.LastAct, x.Ended, x.Granted)
		x0, x1 := xOf(x.Granted), xOf(stop)
		tip := fmt.Sprintf("key %q · fence %d · client %d (%s) · granted %s, last act %s, ended %s",
			x.Key, x.Fence, x.Client, x.Owner, secondsMs(x.Granted), secondsMs(x.LastAct), secondsMs(x.Ended))
		if x.EndReason != "" {
			tip += " · end: " + x.EndReason
		}
		if x.Fault != "" {
			tip += " · fault: " + x.Fault
		}
		t.Holds = append(t.Holds, holdBar{
			X: x0, W: max(x1-x0, 1.5), Y: rowY(x.Client) + 4, H: rowHeight - 8,
			Color: color[x.Key], Faulted: x.Fault != "", Tip: tip,
		})
	}

	// Writes: every refused and stale-accepted one, the others sampled
	// when there are too many.
	stale := staleWrites(h)
	k := 1
	if len(h.Writes) > maxWriteTicks {
		k = (len(h.Writes) + maxWriteTicks - 1) / maxWriteTicks
	}
	ordinary, drawn := 0, 0
	for i, x := range h.Writes {
		if !inRows(x.Client) {
			continue
		}
		y := rowY(x.Client)
		wt := writeTick{X: xOf(x.Invoke), Y1: y + 2, Y2: y + rowHeight - 2}
		switch {
		case stale[i]:
			wt.Class, wt.Y1, wt.Y2 = "w-stale", y, y+rowHeight
			wt.Tip = fmt.Sprintf("STALE write accepted: key %q · fence %d · client %d · sent %s", x.Key, x.Fence, x.Client, secondsMs(x.Invoke))
		case x.Refused:
			wt.Class = "w-refused"
			wt.Tip = fmt.Sprintf("write refused (stale fence): key %q · fence %d · client %d · sent %s", x.Key, x.Fence, x.Client, secondsMs(x.Invoke))
		default:
			ordinary++
			if (ordinary-1)%k != 0 {
				continue
			}
			wt.Class = "w-ok"
			if !x.Accepted {
				wt.Class = "w-failed"
			}
		}
		drawn++
		t.Writes = append(t.Writes, wt)
	}

	// Double grants, as the checker counts them: b granted before a's
	// holder last acted, a different owner.
	byKey := map[string][]Hold{}
	for _, x := range h.Holds {
		byKey[x.Key] = append(byKey[x.Key], x)
	}
	markersDropped := 0
	for _, key := range keys {
		hs := byKey[key]
		slices.SortFunc(hs, func(a, b Hold) int { return cmp.Compare(a.Granted, b.Granted) })
		for i, a := range hs {
			for _, b := range hs[i+1:] {
				if b.Granted >= a.LastAct {
					break
				}
				if b.Owner == a.Owner || !inRows(a.Client) || !inRows(b.Client) {
					continue
				}
				if len(t.Markers) >= maxMarkers {
					markersDropped++
					continue
				}
				lo, hi := min(a.Client, b.Client), max(a.Client, b.Client)
				t.Markers = append(t.Markers, marker{
					X: xOf(b.Granted), Y1: rowY(lo) + 1, Y2: rowY(hi) + rowHeight - 1,
					Tip: fmt.Sprintf("double grant on %q: client %d (fence %d) granted at %s while client %d (fence %d) acted until %s",
						key, b.Client, b.Fence, secondsMs(b.Granted), a.Client, a.Fence, secondsMs(a.LastAct)),
				})
			}
		}
	}

	t.Caption = append(t.Caption, fmt.Sprintf("%d holds, %d writes, %d fault spans over %s s.",
		len(h.Holds), len(h.Writes), len(h.Faults), seconds(end)))
	if k > 1 {
		t.Caption = append(t.Caption, fmt.Sprintf("More than %d writes: only one in %d accepted or failed writes is drawn (%d ticks of %d writes); every refused and stale-accepted write is drawn.",
			maxWriteTicks, k, drawn, len(h.Writes)))
	}
	if dropped {
		t.Caption = append(t.Caption, fmt.Sprintf("Only the first %d clients are drawn.", maxRows))
	}
	if markersDropped > 0 {
		t.Caption = append(t.Caption, fmt.Sprintf("Only the first %d double-grant markers are drawn (%d more).", maxMarkers, markersDropped))
	}
	return t
}

// staleAccepted marks the accepted writes the checker counts as stale
// (checkWrites' rule): walking accepted writes by send time, one whose
// fence is below the greatest fence of an accepted write of its key that
// completed before it was sent, or equal to it but of another owner.
func staleAccepted(ws []Write) []bool {
	out := make([]bool, len(ws))
	var acc []int
	for i, w := range ws {
		if w.Accepted {
			acc = append(acc, i)
		}
	}
	done := slices.Clone(acc)
	slices.SortStableFunc(done, func(a, b int) int { return cmp.Compare(ws[a].Complete, ws[b].Complete) })
	slices.SortStableFunc(acc, func(a, b int) int { return cmp.Compare(ws[a].Invoke, ws[b].Invoke) })
	type top struct {
		fence  uint64
		owners map[string]bool
	}
	tops := map[string]*top{}
	next := 0
	for _, i := range acc {
		w := ws[i]
		for ; next < len(done) && ws[done[next]].Complete < w.Invoke; next++ {
			d := ws[done[next]]
			t := tops[d.Key]
			switch {
			case t == nil || d.Fence > t.fence:
				tops[d.Key] = &top{fence: d.Fence, owners: map[string]bool{d.Owner: true}}
			case d.Fence == t.fence:
				t.owners[d.Owner] = true
			}
		}
		t := tops[w.Key]
		if t != nil && (w.Fence < t.fence || (w.Fence == t.fence && (!t.owners[w.Owner] || len(t.owners) > 1))) {
			out[i] = true
		}
	}
	return out
}

// axisTicks picks a 1-2-5 step giving at most about 10 labelled ticks.
func axisTicks(end time.Duration, xOf func(time.Duration) px) []axisTick {
	total := end.Seconds()
	raw := total / 10
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	decimals := max(0, int(-math.Floor(math.Log10(step)+1e-9)))
	var ticks []axisTick
	for i := 0; ; i++ {
		v := float64(i) * step
		if v > total*(1+1e-9) {
			break
		}
		ticks = append(ticks, axisTick{
			X:     xOf(time.Duration(v * float64(time.Second))),
			Label: strconv.FormatFloat(v, 'f', decimals, 64) + "s",
		})
	}
	return ticks
}

var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em;color:#222;max-width:1160px}
h1{font-size:1.5em;margin-bottom:.3em}
h2{font-size:1.15em;margin-top:2em;border-top:1px solid #ddd;padding-top:.8em}
table.summary{border-collapse:collapse;font-size:13px}
table.summary th,table.summary td{border:1px solid #ccc;padding:3px 7px;text-align:right}
table.summary th{background:#f3f3f3}
table.summary td.l{text-align:left}
table.summary tr.unsafe td.l:first-child{border-left:4px solid #d62728}
td.bad{color:#fff;background:#d62728;font-weight:bold}
.legend{font-size:13px;line-height:1.7}
.sw{display:inline-block;width:14px;height:10px;vertical-align:middle;border:1px solid #888;margin:0 3px 0 8px}
.sw-fault{background:#f2c6c6}
.sw-hatch{background:repeating-linear-gradient(45deg,#4e79a7 0 3px,#26394f 3px 5px);border:1px dashed #000}
.sw-ok{background:#444;width:2px}
.sw-refused{background:#f28e2b;width:3px}
.sw-red{background:#d62728;width:3px}
svg.timeline{display:block;font-size:11px;font-family:inherit}
svg.timeline .row-odd{fill:#f7f7f7}
svg.timeline .row-even{fill:#fff}
svg.timeline .fault-span{fill:#d62728;fill-opacity:.13}
svg.timeline .fault-name{fill:#a01c1c;font-weight:bold}
svg.timeline .hold-bar{stroke:none}
svg.timeline .hold-bar.faulted{stroke:#000;stroke-width:1.2;stroke-dasharray:3 2}
svg.timeline .hatch{pointer-events:none}
svg.timeline .w-ok{stroke:#444;stroke-width:1}
svg.timeline .w-failed{stroke:#aaa;stroke-width:1}
svg.timeline .w-refused{stroke:#f28e2b;stroke-width:1.6}
svg.timeline .w-stale{stroke:#d62728;stroke-width:2.2}
svg.timeline .violation{stroke:#d62728;stroke-width:2}
svg.timeline .violation-head{fill:#d62728}
svg.timeline .axis{stroke:#888}
svg.timeline .label{fill:#555}
.k0{fill:#4e79a7}.k1{fill:#59a14f}.k2{fill:#b07aa1}.k3{fill:#edc948}.k4{fill:#76b7b2}.k5{fill:#9c755f}.k6{fill:#bab0ac}.k7{fill:#86bcb6}
.s0{background:#4e79a7}.s1{background:#59a14f}.s2{background:#b07aa1}.s3{background:#edc948}.s4{background:#76b7b2}.s5{background:#9c755f}.s6{background:#bab0ac}.s7{background:#86bcb6}
.caption{font-size:12px;color:#555;margin:.3em 0}
ul.violations{font-size:13px;font-family:ui-monospace,Menlo,Consolas,monospace}
.note{font-size:13px;background:#fff4e5;border-left:4px solid #f28e2b;padding:4px 8px}
</style>
</head>
<body>
<header>
<h1>{{.Title}}</h1>
<div class="legend">
<p>Each run: clients acquire a key, write the lease's fence to a fenced register while the lease is valid by their own clock, and release, while the faults are injected in the middle of the run. Times are seconds since the run's start.</p>
<p>Timeline:
<span class="sw s0"></span>a hold (from the grant to the holder's last act or release), coloured by key;
<span class="sw sw-hatch"></span>a hold hit by a client fault;
<span class="sw sw-fault"></span>a fault on;
<span class="sw sw-ok"></span>write accepted;
<span class="sw sw-refused"></span>write refused by the fence;
<span class="sw sw-red"></span>violation: a double grant (red line across both holders' rows) or a stale write accepted.
Hover over a bar or a mark for details.</p>
<p>Table: double grants count pairs of holders that acted at once (in brackets the store's own share, the early grants); a red cell is a safety failure.</p>
</div>
</header>
<main>
<table class="summary">
<thead><tr><th>#</th><th>store</th><th>faults</th><th>double grants (early)</th><th>fence violations</th><th>stale writes accepted</th><th>stale writes refused</th><th>failed acquires during fault</th><th>longest gap (s)</th><th>recovery (s)</th><th>linearizable</th><th>seed</th></tr></thead>
<tbody>
{{range .Rows}}<tr class="result{{if .Unsafe}} unsafe{{end}}"><td class="l"><a href="#{{.Anchor}}">{{.Index}}</a></td><td class="l"><a href="#{{.Anchor}}">{{.Store}}</a></td><td class="l">{{.Faults}}</td>{{with .F}}<td class="dg{{if .EarlyGrants}} bad{{end}}">{{.DoubleGrants}} ({{.EarlyGrants}})</td><td class="fv{{if .FenceViolations}} bad{{end}}">{{.FenceViolations}}</td><td class="swa{{if .StaleWritesAccepted}} bad{{end}}">{{.StaleWritesAccepted}}</td><td class="swr">{{.StaleWritesRefused}}</td><td class="fdf">{{.FailedDuringFault}}</td>{{else}}<td colspan="5" class="l">not checked</td>{{end}}<td class="gap">{{.LongestGap}}</td><td class="rec">{{.Recovery}}</td><td class="lin{{if .F}}{{if eq .F.Linearizable "illegal"}} bad{{end}}{{end}}">{{if .F}}{{.F.Linearizable}}{{end}}</td><td class="seed">{{.Seed}}</td></tr>
{{end}}</tbody>
</table>
{{range .Sections}}
<section class="run" id="{{.Anchor}}">
<h2>#{{.Index}} {{.Store}} × {{.Faults}}</h2>
<p class="caption">{{.Meta}}</p>
{{with .Timeline}}{{$t := .}}<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" role="img">
<defs><pattern id="hatch-{{.ID}}" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#000" stroke-opacity="0.45" stroke-width="2"/></pattern></defs>
{{range .Rows}}<rect class="{{if .Odd}}row-odd{{else}}row-even{{end}}" x="{{$t.Left}}" y="{{.Y}}" width="{{$t.PlotWidth}}" height="{{$t.RowHeight}}"/><text class="label" x="4" y="{{.LabelY}}">{{.Label}}</text>
{{end}}{{range .Faults}}<rect class="fault-span" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}"><title>{{.Tip}}</title></rect><text class="fault-name" x="{{.LabelX}}" y="{{.LabelY}}">{{.Name}}</text>
{{end}}{{$id := .ID}}{{range .Holds}}<rect class="hold-bar k{{.Color}}{{if .Faulted}} faulted{{end}}" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}"><title>{{.Tip}}</title></rect>{{if .Faulted}}<rect class="hatch" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="url(#hatch-{{$id}})"/>{{end}}
{{end}}{{range .Writes}}<line class="{{.Class}}" x1="{{.X}}" x2="{{.X}}" y1="{{.Y1}}" y2="{{.Y2}}">{{if .Tip}}<title>{{.Tip}}</title>{{end}}</line>
{{end}}{{range .Markers}}<g class="violation-marker"><line class="violation" x1="{{.X}}" x2="{{.X}}" y1="{{.Y1}}" y2="{{.Y2}}"/><circle class="violation-head" cx="{{.X}}" cy="{{.Y1}}" r="3.5"/><title>{{.Tip}}</title></g>
{{end}}<line class="axis" x1="{{.Left}}" x2="{{.Right}}" y1="{{.Bot}}" y2="{{.Bot}}"/>
{{range .Ticks}}<line class="axis" x1="{{.X}}" x2="{{.X}}" y1="{{$t.Bot}}" y2="{{$t.TickEnd}}"/><text class="label" x="{{.X}}" y="{{$t.TickLabelY}}" text-anchor="middle">{{.Label}}</text>
{{end}}</svg>
<p class="caption">Keys:{{range .Keys}} <span class="sw s{{.Color}}"></span>{{.Key}}{{end}}</p>
{{range .Caption}}<p class="caption">{{.}}</p>
{{end}}{{else}}<p class="caption">No history was recorded.</p>
{{end}}{{if .HasFindings}}{{if .Violations}}<h3>Violations{{if .Truncated}} (the first {{len .Violations}}){{end}}</h3>
<ul class="violations">
{{range .Violations}}<li>{{.}}</li>
{{end}}</ul>
{{else}}<p class="caption">No violation described.</p>
{{end}}{{end}}{{with .Visualization}}<p class="note">porcupine did not find this history linearizable; its visualisation is in <code>{{.}}</code>.</p>
{{end}}</section>
{{end}}
</main>
</body>
</html>
`))
