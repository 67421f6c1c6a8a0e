package once_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the fixed list of zones below loads without system tzdata

	"github.com/dlock-dev/dlock"
	"github.com/dlock-dev/dlock/recipe/once"
)

// dstZones are zones where a daylight-saving change skips or repeats local
// midnight (or did), scanned when the system has no zone list.
var dstZones = []string{
	"America/Santiago", "America/Asuncion", "America/Havana", "Asia/Beirut",
	"America/Sao_Paulo", "Africa/Cairo", "Asia/Gaza", "America/Scoresbysund",
	"Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Pacific/Apia",
}

// allZones returns every zone of the system's tz database
// (/usr/share/zoneinfo/tzdata.zi), else dstZones.
func allZones(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/usr/share/zoneinfo/tzdata.zi")
	if err != nil {
		t.Logf("no system zone list (%v): scanning %d zones", err, len(dstZones))
		return dstZones
	}
	var zones []string
	for _, ln := range strings.Split(string(b), "\n") {
		if f := strings.Fields(ln); len(f) >= 2 && f[0] == "Z" {
			zones = append(zones, f[1])
		}
	}
	if len(zones) == 0 {
		return dstZones
	}
	return zones
}

// TestPeriod_CalendarWindowsInEveryZone: in every zone, 2020-2035, the
// Daily, Weekly and Monthly windows follow each other without gap or
// overlap, each named by the local calendar date, ISO week or month of
// every instant in it; and every hour within 30 hours of a zone change
// (where the local calendar shifts: between changes it is the UTC one
// moved by a constant) is in the window Window returns, named by its
// local date. Where a daylight-saving change skips local midnight
// (America/Santiago 2026-09-06, America/Asuncion October 2023), time.Date
// normalizes midnight to 23:00 of the day before, which named a day by the
// day before.
func TestPeriod_CalendarWindowsInEveryZone(t *testing.T) {
	zones := allZones(t)
	from := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	to := time.Date(2036, 1, 1, 0, 0, 0, 0, time.UTC)
	scanned, changes := 0, 0
	for _, z := range zones {
		loc, err := time.LoadLocation(z)
		if err != nil {
			t.Logf("%s: %v", z, err)
			continue
		}
		scanned++
		// The zone's changes in [from, to).
		var near []time.Time
		for c := from.In(loc); ; {
			_, end := c.ZoneBounds()
			if end.IsZero() || !end.Before(to) {
				break
			}
			near = append(near, end)
			c = end
		}
		changes += len(near)
		periods := []struct {
			p  once.Period
			id func(y int, m time.Month, d int) string
		}{
			{once.Daily.In(loc), func(y int, m time.Month, d int) string {
				return digits(y, 4) + "-" + digits(int(m), 2) + "-" + digits(d, 2)
			}},
			{once.Weekly.In(loc), func(y int, m time.Month, d int) string {
				wy, wn := time.Date(y, m, d, 12, 0, 0, 0, time.UTC).ISOWeek()
				return digits(wy, 4) + "-W" + digits(wn, 2)
			}},
			{once.Monthly.In(loc), func(y int, m time.Month, _ int) string { return digits(y, 4) + "-" + digits(int(m), 2) }},
		}
		for _, c := range periods {
			bad := 0
			fail := func(format string, args ...any) {
				if bad++; bad <= 3 {
					t.Errorf("%s %v: "+format, append([]any{z, c.p}, args...)...)
				}
			}
			idAt := func(i time.Time) string { return c.id(i.In(loc).Date()) }
			// Every window, one after the other: each is named by the
			// local date of its first and last instants and is the
			// window of its last one; the next starts where it ends (so
			// the Window of its first instant is the window itself) and
			// is named differently.
			w := c.p.Window(from)
			if first := c.p.Window(w.Start); first != w {
				fail("window %s [%v, %v): Window of its first instant %+v", w.ID, w.Start, w.End, first)
			}
			if idAt(w.Start.Add(-time.Nanosecond)) == w.ID {
				fail("window %s starts at %v, after its first instant %v", w.ID, w.Start, w.Start.Add(-time.Nanosecond).In(loc))
			}
			for w.Start.Before(to) {
				last := w.End.Add(-time.Nanosecond)
				switch {
				case !w.Start.Before(w.End):
					fail("window %s [%v, %v) is empty", w.ID, w.Start, w.End)
				case idAt(w.Start) != w.ID || idAt(last) != w.ID:
					fail("window %s [%v, %v): local %v (%s) to %v (%s)", w.ID, w.Start, w.End, w.Start.In(loc), idAt(w.Start), last.In(loc), idAt(last))
				case c.p.Window(last) != w:
					fail("window %s [%v, %v): Window of its last instant %+v", w.ID, w.Start, w.End, c.p.Window(last))
				}
				next := c.p.Window(w.End)
				if !next.Start.Equal(w.End) || next.ID == w.ID {
					fail("window %s [%v, %v) is followed by %s [%v, %v)", w.ID, w.Start, w.End, next.ID, next.Start, next.End)
					break
				}
				w = next
			}
			// Every hour near a change (and the change itself).
			for _, ch := range near {
				hours := []time.Time{ch, ch.Add(-time.Nanosecond)}
				for h := ch.Add(-30 * time.Hour).Truncate(time.Hour); h.Before(ch.Add(30 * time.Hour)); h = h.Add(time.Hour) {
					hours = append(hours, h)
				}
				for _, i := range hours {
					w := c.p.Window(i)
					if i.Before(w.Start) || !i.Before(w.End) {
						fail("%v: window %s [%v, %v) does not contain it", i, w.ID, w.Start, w.End)
					}
					if want := idAt(i); w.ID != want {
						fail("%v (local %v): window %s, want %s", i, i.In(loc), w.ID, want)
					}
				}
			}
			if bad > 3 {
				t.Errorf("%s %v: %d more", z, c.p, bad-3)
			}
		}
	}
	t.Logf("scanned %d zones, %d changes", scanned, changes)
}

// digits returns n in decimal, zero-padded to w digits (n ≥ 0): a
// Sprintf("%0*d") that keeps the scan below fast under -race.
func digits(n, w int) string {
	var b [20]byte
	i := len(b)
	for ; n > 0 || i > len(b)-w; n /= 10 {
		i--
		b[i] = byte('0' + n%10)
	}
	return string(b[i:])
}

// TestPeriod_MidnightDSTWindows: the reviewer's cases, with their bounds.
func TestPeriod_MidnightDSTWindows(t *testing.T) {
	santiago, err := time.LoadLocation("America/Santiago")
	if err != nil {
		t.Fatal(err)
	}
	asuncion, err := time.LoadLocation("America/Asuncion")
	if err != nil {
		t.Fatal(err)
	}
	// Santiago 2026-09-06: 00:00 -04 does not exist; the day starts at
	// 01:00 -03 (04:00Z), the day before ends there.
	sep6 := time.Date(2026, 9, 6, 4, 0, 0, 0, time.UTC)
	cases := []struct {
		p          once.Period
		at         time.Time
		id         string
		start, end time.Time
	}{
		{once.Daily.In(santiago), time.Date(2026, 9, 6, 16, 0, 0, 0, time.UTC), "2026-09-06", sep6, time.Date(2026, 9, 7, 3, 0, 0, 0, time.UTC)},
		{once.Daily.In(santiago), time.Date(2026, 9, 5, 16, 0, 0, 0, time.UTC), "2026-09-05", time.Date(2026, 9, 5, 4, 0, 0, 0, time.UTC), sep6},
		{once.Daily.In(santiago), sep6, "2026-09-06", sep6, time.Date(2026, 9, 7, 3, 0, 0, 0, time.UTC)},
		{once.Daily.In(santiago), sep6.Add(-time.Nanosecond), "2026-09-05", time.Date(2026, 9, 5, 4, 0, 0, 0, time.UTC), sep6},
		{once.Weekly.In(santiago), time.Date(2026, 9, 6, 16, 0, 0, 0, time.UTC), "2026-W36", time.Date(2026, 8, 31, 4, 0, 0, 0, time.UTC), time.Date(2026, 9, 7, 3, 0, 0, 0, time.UTC)},
		// Asuncion 2023-10-01: 00:00 -04 does not exist; October starts at
		// 01:00 -03 (04:00Z).
		{once.Monthly.In(asuncion), time.Date(2023, 10, 15, 12, 0, 0, 0, time.UTC), "2023-10", time.Date(2023, 10, 1, 4, 0, 0, 0, time.UTC), time.Date(2023, 11, 1, 3, 0, 0, 0, time.UTC)},
		{once.Monthly.In(asuncion), time.Date(2023, 9, 15, 12, 0, 0, 0, time.UTC), "2023-09", time.Date(2023, 9, 1, 4, 0, 0, 0, time.UTC), time.Date(2023, 10, 1, 4, 0, 0, 0, time.UTC)},
	}
	for _, c := range cases {
		w := c.p.Window(c.at)
		if w.ID != c.id || !w.Start.Equal(c.start) || !w.End.Equal(c.end) {
			t.Errorf("%v at %v: %s [%v, %v), want %s [%v, %v)", c.p, c.at, w.ID, w.Start.UTC(), w.End.UTC(), c.id, c.start, c.end)
		}
	}
}

// TestPeriod_StringParsesBack: ParsePeriod reads what String prints, for
// every constructor, in UTC and in other zones.
func TestPeriod_StringParsesBack(t *testing.T) {
	var locs []*time.Location
	for _, z := range []string{"UTC", "Europe/Paris", "America/Santiago", "Asia/Kolkata", "America/Argentina/Buenos_Aires", "Local"} {
		loc, err := time.LoadLocation(z)
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, loc)
	}
	base := []once.Period{once.Hourly, once.Daily, once.Weekly, once.Monthly}
	for _, d := range []time.Duration{time.Second, 15 * time.Minute, 90 * time.Minute, 36 * time.Hour, once.MaxEvery} {
		p, err := once.Every(d)
		if err != nil {
			t.Fatal(err)
		}
		base = append(base, p)
	}
	var periods []once.Period
	for _, p := range base {
		periods = append(periods, p)
		for _, loc := range locs {
			periods = append(periods, p.In(loc))
		}
	}
	at := []time.Time{
		time.Date(2026, 12, 31, 23, 30, 15, 0, time.UTC),
		time.Date(2026, 9, 6, 3, 30, 0, 0, time.UTC),
		time.Date(2027, 3, 28, 0, 30, 0, 0, time.UTC),
	}
	for _, p := range periods {
		s := p.String()
		q, err := once.ParsePeriod(s)
		if err != nil {
			t.Errorf("ParsePeriod(%q) (String of %#v): %v", s, p, err)
			continue
		}
		if q.String() != s {
			t.Errorf("ParsePeriod(%q).String() = %q", s, q.String())
		}
		for _, a := range at {
			if w, v := p.Window(a), q.Window(a); w.ID != v.ID || !w.Start.Equal(v.Start) || !w.End.Equal(v.End) {
				t.Errorf("%q: window at %v %+v, parsed back %+v", s, a, w, v)
			}
		}
	}
	for _, s := range []string{"day Nowhere/Atlantis", "hour Europe/Paris", "15m Europe/Paris", "day Europe/Paris extra", "Europe/Paris"} {
		if _, err := once.ParsePeriod(s); !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Errorf("ParsePeriod(%q) = %v, want ErrInvalidArgument", s, err)
		}
	}
}
