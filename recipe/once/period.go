package once

import (
	"fmt"
	"strings"
	"time"

	"github.com/dlock-dev/dlock"
)

// Bounds of a fixed-length period (Every).
const (
	// MinEvery is the shortest period Every accepts: 1 s.
	MinEvery = time.Second
	// MaxEvery is the longest period Every accepts: 366 days.
	MaxEvery = 366 * 24 * time.Hour
)

type unit int

const (
	unitNone unit = iota
	unitHour
	unitDay
	unitWeek
	unitMonth
	unitEvery
)

// Period divides time into consecutive windows; Run runs a job at most once
// per window. Calendar periods (Hourly, Daily, Weekly, Monthly) follow the
// calendar in a time zone (UTC unless In says otherwise); Every(d) windows
// are d long, aligned to the Unix epoch. The zero Period is invalid (Run
// returns an error matching dlock.ErrInvalidArgument).
//
// A window is always computed from the ledger's clock (Ledger.Now), never
// from the calling node's own clock alone: see the package doc.
type Period struct {
	unit  unit
	every time.Duration
	loc   *time.Location
}

// The calendar periods, in UTC (see Period.In for another time zone).
var (
	// Hourly: one window per clock hour, "2026-12-01T07Z". Hours are
	// always UTC hours (In does not change them): a local hour repeats or
	// vanishes at a daylight-saving change.
	Hourly = Period{unit: unitHour}
	// Daily: one window per calendar day, "2026-12-01".
	Daily = Period{unit: unitDay}
	// Weekly: one window per ISO 8601 week, Monday to Monday, "2026-W49".
	Weekly = Period{unit: unitWeek}
	// Monthly: one window per calendar month, "2026-12".
	Monthly = Period{unit: unitMonth}
)

// Every returns the period of fixed windows d long, aligned to the Unix
// epoch (window n is [n·d, (n+1)·d) after 1970-01-01T00:00:00Z), with IDs
// such as "2026-12-01T07:15:00Z/15m0s". d must lie in [MinEvery, MaxEvery]
// (1 s to 366 days), else the error matches dlock.ErrInvalidArgument.
func Every(d time.Duration) (Period, error) {
	if d < MinEvery || d > MaxEvery {
		return Period{}, fmt.Errorf("once: period %v is outside [%v, %v]: %w", d, MinEvery, MaxEvery, dlock.ErrInvalidArgument)
	}
	return Period{unit: unitEvery, every: d}, nil
}

// ParsePeriod parses a period as the CLI's --once-per takes it, and as
// Period.String prints it: "hour", "day", "week" or "month" (also "hourly",
// "daily", "weekly", "monthly"), or a Go duration such as "15m" or "36h"
// (Every). "day", "week" and "month" may be followed by a space and a time
// zone that time.LoadLocation reads ("day Europe/Paris": Daily.In that
// zone); hours and durations do not depend on a time zone and take none.
// Anything else is an error matching dlock.ErrInvalidArgument.
func ParsePeriod(s string) (Period, error) {
	bad := func(why string) (Period, error) {
		return Period{}, fmt.Errorf("once: period %q: %s: %w", s, why, dlock.ErrInvalidArgument)
	}
	const want = "want hour, day, week, month or a duration such as 15m, and for day, week or month a time zone such as \"day Europe/Paris\""
	f := strings.Fields(s)
	if len(f) == 0 || len(f) > 2 {
		return bad(want)
	}
	var p Period
	switch strings.ToLower(f[0]) {
	case "hour", "hourly":
		p = Hourly
	case "day", "daily":
		p = Daily
	case "week", "weekly":
		p = Weekly
	case "month", "monthly":
		p = Monthly
	default:
		d, err := time.ParseDuration(f[0])
		if err != nil {
			return bad(want)
		}
		if p, err = Every(d); err != nil {
			return Period{}, err
		}
	}
	if len(f) == 1 {
		return p, nil
	}
	if p.unit != unitDay && p.unit != unitWeek && p.unit != unitMonth {
		return bad("a time zone applies to day, week and month only (hours and durations are the same in every zone)")
	}
	loc, err := time.LoadLocation(f[1])
	if err != nil {
		return bad(fmt.Sprintf("time zone %q: %v", f[1], err))
	}
	return p.In(loc), nil
}

// In returns the calendar period p in the time zone loc: Daily, Weekly and
// Monthly windows then start at local midnight (or at the daylight-saving
// change that skips it) and are named by local dates. Hourly and Every
// periods do not depend on a time zone and are returned unchanged; so is p
// when loc is nil.
func (p Period) In(loc *time.Location) Period {
	if loc != nil && (p.unit == unitDay || p.unit == unitWeek || p.unit == unitMonth) {
		p.loc = loc
	}
	return p
}

// Valid reports whether p is one of the periods above (not the zero Period).
func (p Period) Valid() bool { return p.unit != unitNone }

// String returns p as ParsePeriod reads it: "hour", "day", "week",
// "month", or the duration of an Every period; a time zone other than UTC
// is appended after a space, by its name ("day Europe/Paris"). A zone that
// time.LoadLocation cannot load by that name (one made by time.FixedZone)
// does not parse back. The zero Period is "invalid period".
func (p Period) String() string {
	var s string
	switch p.unit {
	case unitHour:
		s = "hour"
	case unitDay:
		s = "day"
	case unitWeek:
		s = "week"
	case unitMonth:
		s = "month"
	case unitEvery:
		return p.every.String()
	default:
		return "invalid period"
	}
	if p.loc != nil && p.loc != time.UTC {
		s += " " + p.loc.String()
	}
	return s
}

// Window is one window of a Period: the half-open interval [Start, End) of
// the ledger's clock, named by ID (the ledger's key for the window).
type Window struct {
	// ID names the window, unique within its Period: "2026-12-01T07Z"
	// (Hourly), "2026-12-01" (Daily), "2026-W49" (Weekly), "2026-12"
	// (Monthly), "2026-12-01T07:15:00Z/15m0s" (Every).
	ID string
	// Start is the window's first instant, End the first instant after it.
	Start, End time.Time
}

// Window returns the window of p that contains t. It panics on the zero
// Period (Run checks Valid first).
//
// A calendar window is named by the local calendar date of t (its month,
// its ISO week), never by a normalized instant, and starts at the first
// instant of that local day: local midnight, or, where a daylight-saving
// change skips midnight (America/Santiago, America/Asuncion ...), the
// change itself. Its End is the next window's Start.
func (p Period) Window(t time.Time) Window {
	loc := p.loc
	if loc == nil {
		loc = time.UTC
	}
	switch p.unit {
	case unitHour:
		s := t.UTC().Truncate(time.Hour)
		return Window{ID: s.Format("2006-01-02T15Z"), Start: s, End: s.Add(time.Hour)}
	case unitDay:
		day := civil(t.In(loc).Date())
		return Window{ID: day.Format("2006-01-02"), Start: dayStart(day, loc), End: dayStart(day.AddDate(0, 0, 1), loc)}
	case unitWeek:
		day := civil(t.In(loc).Date())
		mon := day.AddDate(0, 0, -((int(day.Weekday()) + 6) % 7)) // back to Monday
		wy, wn := day.ISOWeek()
		return Window{ID: fmt.Sprintf("%04d-W%02d", wy, wn), Start: dayStart(mon, loc), End: dayStart(mon.AddDate(0, 0, 7), loc)}
	case unitMonth:
		y, m, _ := t.In(loc).Date()
		first := civil(y, m, 1)
		return Window{ID: first.Format("2006-01"), Start: dayStart(first, loc), End: dayStart(first.AddDate(0, 1, 0), loc)}
	case unitEvery:
		n := t.UnixNano() / int64(p.every)
		if t.UnixNano() < 0 && t.UnixNano()%int64(p.every) != 0 {
			n-- // floor, before 1970
		}
		s := time.Unix(0, n*int64(p.every)).UTC()
		return Window{ID: s.Format(time.RFC3339Nano) + "/" + p.every.String(), Start: s, End: s.Add(p.every)}
	}
	panic("once: Window of the zero Period")
}

// civil returns the calendar date y-m-d as midnight UTC, where every date
// exists: calendar arithmetic (AddDate, Weekday, ISOWeek) and IDs use it.
func civil(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, 0, 0, 0, 0, time.UTC) }

// dayStart returns the first instant whose local date in loc is day (a
// civil date) or later: local midnight of day when it exists, else the
// daylight-saving change that skips it. time.Date cannot be used for it:
// it normalizes a midnight that does not exist to the previous day.
//
// It walks loc's zone intervals forward from an instant whose local time is
// surely before day (offsets, local mean time included, lie within ±16 h) and, in each interval of
// offset off, the local time t+off grows with t: the first instant of the
// interval at or after day's midnight is max(start, midnight-off).
func dayStart(day time.Time, loc *time.Location) time.Time {
	if loc == time.UTC {
		return day
	}
	midnight := day.Unix() // local midnight of day, as seconds of the local clock
	t := time.Unix(midnight-16*3600, 0).In(loc)
	for range 64 { // a handful of intervals within a day and a half
		_, off := t.Zone()
		_, end := t.ZoneBounds()
		s := midnight - int64(off)
		if s < t.Unix() {
			s = t.Unix() // the interval starts on day or later: at its start
		}
		if end.IsZero() || s < end.Unix() {
			return time.Unix(s, 0).In(loc)
		}
		t = end
	}
	return time.Date(day.Year(), day.Month(), day.Day(), 0, 0, 0, 0, loc) // unreachable with real zones
}
