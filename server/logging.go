package server

// logging.go owns the server's logs: the hclog adapter that carries Raft's
// logs into the server's slog.Handler, the lines the lock table's events
// produce, the per-request debug line and the start-up cleanup of
// interrupted snapshots. It touches nothing but the logger and, at start,
// DataDir/snapshots.
//
// What is logged at which level:
//
//   - info: start and stop, leader changes (Raft's "entering leader state"
//     and friends, and "dlockd: leader and ready"), a queued waiter granted
//     a key by handoff, a grant that ended otherwise than by its holder's
//     release (expired, force-released, not claimed), removed leftovers of
//     interrupted snapshots; limit refusals (rate-limited, logged where they
//     happen).
//   - debug: one line per API call (logRequest), and Raft's debug lines.
//   - warn and error: something an operator should look at. A normal start
//     of a single node logs none (see demoteRaft).
//
// Owner tokens and session IDs are never logged: they are the bearer
// credentials of a grant (whoever knows one can release it).

import (
	"bytes"
	"context"
	"encoding"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// maxEventLines is the most lines logEvents writes for one applied batch;
// a larger batch gets one summary line.
const maxEventLines = 32

// logEvents logs the lock-table changes an operator cares about, at info: a
// key handed to a queued waiter (a grant after contention) and a grant that
// ended otherwise than by its holder's release. It runs on the FSM goroutine
// (from lockEvents) and returns at once when info is not enabled.
func (s *Server) logEvents(evs []event) {
	ctx := context.Background()
	if !s.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	if len(evs) > maxEventLines {
		// A burst (a batch of up to 1,024 expiries after a pause, a purge)
		// is summarised, so the FSM goroutine does not write a line each.
		var handed, expired, other int
		for i := range evs {
			switch ev := &evs[i]; {
			case ev.kind == evGranted && ev.handoff:
				handed++
			case ev.kind == evRemoved && ev.reason == reasonExpired:
				expired++
			case ev.kind == evRemoved && ev.reason != reasonReleased && ev.reason != reasonCancelled:
				other++
			}
		}
		s.log.LogAttrs(ctx, slog.LevelInfo, "dlockd: lock table burst",
			slog.Int("events", len(evs)), slog.Int("handed_to_waiters", handed),
			slog.Int("expired", expired), slog.Int("forced_or_unclaimed", other))
		return
	}
	for i := range evs {
		ev := &evs[i]
		switch ev.kind {
		case evGranted:
			if !ev.handoff {
				continue
			}
			s.log.LogAttrs(ctx, slog.LevelInfo, "dlockd: key handed to waiter",
				slog.String("key", ev.key), slog.Uint64("fence", ev.fence), slog.Duration("ttl", ev.ttl),
				slog.String("holder", ev.holder))
		case evRemoved:
			switch ev.reason {
			case reasonReleased, reasonCancelled:
				// The holder's own doing: one debug line per request says so.
			case reasonExpired:
				s.log.LogAttrs(ctx, slog.LevelInfo, "dlockd: lease expired",
					slog.String("key", ev.key), slog.Uint64("fence", ev.fence), slog.Duration("ttl", ev.ttl),
					slog.String("holder", ev.holder))
			default: // reasonForced, reasonUnclaimed and any later reason
				s.log.LogAttrs(ctx, slog.LevelInfo, "dlockd: grant ended",
					slog.String("key", ev.key), slog.Uint64("fence", ev.fence),
					slog.String("reason", ev.reason.String()), slog.String("holder", ev.holder))
			}
		}
	}
}

// logRequest logs one finished API call at debug: its method (named as in
// the metrics, e.g. "Acquire" for gRPC, HTTP and Session alike), its key
// ("" when the call has none), its gRPC code and its duration. It returns
// before any work when debug is not enabled, so it is cheap to call on
// every request. The gRPC interceptors call it for unary calls and streams;
// the HTTP handlers and Session's calls must call it when they answer.
func (s *Server) logRequest(method, key string, err error, d time.Duration) {
	if !s.debugEnabled() {
		return
	}
	s.logCall(methodName(method), key, codeOf(err, false), err, d)
}

// debugEnabled reports whether the logger takes debug lines.
func (s *Server) debugEnabled() bool { return s.log.Enabled(context.Background(), slog.LevelDebug) }

// logCall writes the debug line of one call (see logRequest), with the
// error's text when the call failed otherwise than by the client's doing.
func (s *Server) logCall(method, key, code string, err error, d time.Duration) {
	ctx := context.Background()
	if err == nil || code == codeCanceled {
		s.log.LogAttrs(ctx, slog.LevelDebug, "dlockd: request",
			slog.String("method", method), slog.String("key", key),
			slog.String("code", code), slog.Duration("duration", d))
		return
	}
	s.log.LogAttrs(ctx, slog.LevelDebug, "dlockd: request",
		slog.String("method", method), slog.String("key", key),
		slog.String("code", code), slog.Duration("duration", d), slog.String("err", err.Error()))
}

// snapshotTmpSuffix is the suffix hashicorp/raft's FileSnapshotStore gives
// a snapshot directory while it is being written; Close renames it.
const snapshotTmpSuffix = ".tmp"

// removeSnapshotTemps removes the directories of snapshots that were being
// written when a previous run was killed (DataDir/snapshots/*.tmp), logging
// each at info. They are never read (raft skips them with a warning) and a
// snapshot is as large as the lock table, so they would pile up. Call it
// while this server holds the data directory (after opening raft.db, whose
// file lock keeps a second dlockd out) and before raft starts snapshotting.
// A failure is logged and otherwise ignored: raft skips the directory.
func (s *Server) removeSnapshotTemps() {
	dir := filepath.Join(s.cfg.DataDir, "snapshots")
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !os.IsNotExist(err) {
			s.log.Warn("dlockd: read snapshot dir", "dir", dir, "err", err)
		}
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasSuffix(e.Name(), snapshotTmpSuffix) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if err := os.RemoveAll(path); err != nil {
			s.log.Warn("dlockd: remove interrupted snapshot", "path", path, "err", err)
			continue
		}
		s.log.Info("dlockd: removed interrupted snapshot", "path", path)
	}
}

// raftLevels maps the levels of Config.RaftLogLevel to slog levels. Trace
// is slog's DEBUG-4.
var raftLevels = map[string]slog.Level{
	"trace": slog.LevelDebug - 4,
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
}

// hclogToSlog maps an hclog level to the slog level its lines carry.
func hclogToSlog(l hclog.Level) slog.Level {
	switch l {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default: // Info, NoLevel
		return slog.LevelInfo
	}
}

// slogToHclog maps a slog level to the hclog level whose lines it lets
// through.
func slogToHclog(l slog.Level) hclog.Level {
	switch {
	case l <= slog.LevelDebug-4:
		return hclog.Trace
	case l <= slog.LevelDebug:
		return hclog.Debug
	case l <= slog.LevelInfo:
		return hclog.Info
	case l <= slog.LevelWarn:
		return hclog.Warn
	default:
		return hclog.Error
	}
}

// demoteRaft returns the level a Raft line is logged at: its own, except
// for warnings that are normal events. hashicorp/raft warns "heartbeat
// timeout reached, starting election" whenever a follower hears from no
// leader, which includes every start: a single voter (and every node of a
// cluster booting together) has no leader until it wins its first
// election. A node that had a leader and lost it (last-leader-id set) still
// warns.
func demoteRaft(level hclog.Level, msg string, args []any) hclog.Level {
	if level != hclog.Warn || msg != "heartbeat timeout reached, starting election" {
		return level
	}
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == "last-leader-id" {
			if fmt.Sprint(args[i+1]) != "" {
				return level
			}
		}
	}
	return hclog.Info
}

// hclogSlog is an hclog.Logger that writes into a slog.Handler, so that
// Raft (and raft-wal, and the Raft transport) log in the server's format at
// the server's level. Each line carries component="raft" (or the name
// given by Named) and hclog's key/value pairs as attributes.
type hclogSlog struct {
	h       slog.Handler
	name    string
	implied []any
	// level is the override of the handler's own level, shared by every
	// logger derived with With or Named: an hclog level, or hclog.NoLevel
	// to follow the handler (ask h.Enabled).
	level *atomic.Int32
}

// newHclogSlog returns an hclog.Logger named name writing into h. With
// level "" it logs what h is enabled for; with a level of
// Config.RaftLogLevel (other than "off") it logs that level and above,
// whatever h's own level.
func newHclogSlog(h slog.Handler, name, level string) hclog.Logger {
	l := &hclogSlog{h: h, name: name, level: new(atomic.Int32)}
	if lv, ok := raftLevels[level]; ok {
		l.level.Store(int32(slogToHclog(lv)))
	}
	return l
}

func (l *hclogSlog) enabled(lv slog.Level) bool {
	if o := hclog.Level(l.level.Load()); o != hclog.NoLevel {
		return o != hclog.Off && lv >= hclogToSlog(o)
	}
	return l.h.Enabled(context.Background(), lv)
}

// Log implements hclog.Logger.
func (l *hclogSlog) Log(level hclog.Level, msg string, args ...any) {
	level = demoteRaft(level, msg, args)
	lv := hclogToSlog(level)
	if !l.enabled(lv) {
		return
	}
	r := slog.NewRecord(time.Now(), lv, msg, 0)
	r.AddAttrs(slog.String("component", l.name))
	addHclogArgs(&r, l.implied)
	addHclogArgs(&r, args)
	_ = l.h.Handle(context.Background(), r)
}

// addHclogArgs adds hclog's alternating keys and values to r. As hclog
// does, an odd value at the end is kept as EXTRA_VALUE_AT_END and an
// hclog.Format value is formatted with fmt.Sprintf.
func addHclogArgs(r *slog.Record, args []any) {
	for i := 0; i < len(args); i += 2 {
		if i+1 == len(args) {
			r.AddAttrs(slog.Any("EXTRA_VALUE_AT_END", hclogValue(args[i])))
			return
		}
		k, ok := args[i].(string)
		if !ok {
			k = fmt.Sprint(args[i])
		}
		r.AddAttrs(slog.Any(k, hclogValue(args[i+1])))
	}
}

// hclogValue converts an hclog value for slog: an hclog.Format is
// formatted, and a value slog would encode as an opaque struct but that
// has a String method (raft passes *raft.Raft, "Node at ADDR [Leader]") is
// that string, so that JSON and text lines say the same.
func hclogValue(v any) any {
	switch x := v.(type) {
	case hclog.Format:
		if len(x) == 0 {
			return ""
		}
		if format, ok := x[0].(string); ok {
			return fmt.Sprintf(format, x[1:]...)
		}
		return fmt.Sprint(x...)
	case error, json.Marshaler, encoding.TextMarshaler:
		return v
	case fmt.Stringer:
		if slog.AnyValue(v).Kind() == slog.KindAny {
			return x.String()
		}
	}
	return v
}

// Trace implements hclog.Logger.
func (l *hclogSlog) Trace(msg string, args ...any) { l.Log(hclog.Trace, msg, args...) }

// Debug implements hclog.Logger.
func (l *hclogSlog) Debug(msg string, args ...any) { l.Log(hclog.Debug, msg, args...) }

// Info implements hclog.Logger.
func (l *hclogSlog) Info(msg string, args ...any) { l.Log(hclog.Info, msg, args...) }

// Warn implements hclog.Logger.
func (l *hclogSlog) Warn(msg string, args ...any) { l.Log(hclog.Warn, msg, args...) }

// Error implements hclog.Logger.
func (l *hclogSlog) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }

// IsTrace implements hclog.Logger.
func (l *hclogSlog) IsTrace() bool { return l.enabled(hclogToSlog(hclog.Trace)) }

// IsDebug implements hclog.Logger.
func (l *hclogSlog) IsDebug() bool { return l.enabled(slog.LevelDebug) }

// IsInfo implements hclog.Logger.
func (l *hclogSlog) IsInfo() bool { return l.enabled(slog.LevelInfo) }

// IsWarn implements hclog.Logger.
func (l *hclogSlog) IsWarn() bool { return l.enabled(slog.LevelWarn) }

// IsError implements hclog.Logger.
func (l *hclogSlog) IsError() bool { return l.enabled(slog.LevelError) }

// ImpliedArgs implements hclog.Logger.
func (l *hclogSlog) ImpliedArgs() []any { return l.implied }

// With implements hclog.Logger.
func (l *hclogSlog) With(args ...any) hclog.Logger {
	c := *l
	c.implied = append(append([]any(nil), l.implied...), args...)
	return &c
}

// Name implements hclog.Logger.
func (l *hclogSlog) Name() string { return l.name }

// Named implements hclog.Logger: the name becomes "raft.<name>".
func (l *hclogSlog) Named(name string) hclog.Logger {
	c := *l
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

// ResetNamed implements hclog.Logger.
func (l *hclogSlog) ResetNamed(name string) hclog.Logger {
	c := *l
	c.name = name
	return &c
}

// SetLevel implements hclog.Logger: it overrides the handler's level for
// this logger and every logger derived from it; hclog.NoLevel follows the
// handler again.
func (l *hclogSlog) SetLevel(level hclog.Level) { l.level.Store(int32(level)) }

// GetLevel implements hclog.Logger: the override, or the lowest level the
// handler is enabled for.
func (l *hclogSlog) GetLevel() hclog.Level {
	if o := hclog.Level(l.level.Load()); o != hclog.NoLevel {
		return o
	}
	for _, lv := range []hclog.Level{hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error} {
		if l.h.Enabled(context.Background(), hclogToSlog(lv)) {
			return lv
		}
	}
	return hclog.Off
}

// StandardLogger implements hclog.Logger.
func (l *hclogSlog) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(l.StandardWriter(opts), "", 0)
}

// StandardWriter implements hclog.Logger: each write is one line, at
// opts.ForceLevel, or inferred from a "[WARN]"-style prefix with
// opts.InferLevels, or info.
func (l *hclogSlog) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	if opts == nil {
		opts = &hclog.StandardLoggerOptions{}
	}
	return &hclogWriter{l: l, opts: *opts}
}

type hclogWriter struct {
	l    *hclogSlog
	opts hclog.StandardLoggerOptions
}

var inferredLevels = []struct {
	prefix string
	level  hclog.Level
}{
	{"[TRACE]", hclog.Trace}, {"[DEBUG]", hclog.Debug}, {"[INFO]", hclog.Info},
	{"[WARN]", hclog.Warn}, {"[ERR]", hclog.Error}, {"[ERROR]", hclog.Error},
}

func (w *hclogWriter) Write(p []byte) (int, error) {
	msg := string(bytes.TrimRight(p, "\r\n"))
	level := hclog.Info
	if w.opts.ForceLevel != hclog.NoLevel {
		level = w.opts.ForceLevel
	} else if w.opts.InferLevels {
		for _, il := range inferredLevels {
			if rest, ok := strings.CutPrefix(msg, il.prefix); ok {
				level, msg = il.level, strings.TrimSpace(rest)
				break
			}
		}
	}
	w.l.Log(level, msg)
	return len(p), nil
}
