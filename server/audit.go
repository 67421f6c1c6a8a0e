package server

// The audit log (issue 12): one JSON line for every admin action (a force
// release, a membership change, a leadership transfer, an auth file
// reload) and for every refusal of authentication or authorisation, to
// Config.AuditLogFile, rotated by size. This file owns that file, its
// writer goroutine and the metrics dlockd_audit_events_total{action,result}
// and dlockd_audit_write_errors_total; the callers are auth.go (denials),
// api.go (force release), cluster.go (membership) and Reload.
//
// # Lines
//
//	{"time":"2026-05-01T10:00:00.123456789Z","node":"n1","identity":"ops",
//	 "remote":"10.0.0.7:50412","action":"force-release","key":"payout:42",
//	 "reason":"stuck job","result":"ok"}
//
// time is RFC 3339 in UTC with nanoseconds; identity the name from the auth
// file ("member:<id>" for another member, "anonymous" without an auth
// file or credentials, "signal:SIGHUP" for dlockd's reload on SIGHUP);
// via, on a call another member forwarded for identity, that member's
// node ID (the certificate that made the call); remote the caller's
// address when known; action an admin action (force-release, cluster-add,
// cluster-remove, cluster-transfer-leader, auth-reload, tls-reload) or,
// for a refusal, the operation
// refused (the gRPC method, "Lock/Acquire", or the HTTP request, "POST
// /v1/acquire"); key the key ("" for cluster-wide actions); reason the
// operator's reason of a force release, or the refusal's message (which
// names the missing permission, or why a reload failed); result "ok",
// "failed" (a reload that did not parse or read), or the gRPC code of the answer ("PERMISSION_DENIED",
// "UNAUTHENTICATED", "NOT_FOUND", ...). A token never appears: only its
// identity's name.
//
// # Writing
//
// A request never waits on the disk: lines go through a buffer of
// auditBuffer lines to one writer goroutine. When the buffer is full a
// request waits at most auditWaitMax for room; a line that still does not
// fit, and a line whose write fails, is counted in
// dlockd_audit_write_errors_total and logged (at most once a second), never
// dropped in silence. Every event is counted in
// dlockd_audit_events_total{action,result}, where action is the admin
// action or "deny" for every refusal (bounded labels), with or without a
// file. Without Config.AuditLogFile the lines go to the server's log at
// info instead.
//
// # Floods of refusals
//
// A refusal of authentication (UNAUTHENTICATED: no, or a bad, credential)
// is not attributable to an identity, and anyone who reaches the port can
// send them: left alone, 300 bad requests would rotate every earlier line
// out of a small audit log. They are aggregated per remote IP: at most one
// line (in the audit log, or the server's log without one) per IP every
// denyLogEvery; the next line written for that IP says how many were
// suppressed in between ("suppressed": N). The table of IPs holds at most
// denyLimiterMax entries (the longest quiet one is evicted first). A
// refusal of authorisation (PERMISSION_DENIED) names a known identity and
// stays one audit line each; its line in the server's log (without an
// audit log) is limited the same way per identity. Admin actions are
// never suppressed, and dlockd_audit_events_total counts every event.
//
// # Rotation
//
// Before a line would take the file past Config.AuditLogMaxBytes, the file
// is renamed FILE.1 (FILE.1 to FILE.2, and so on; FILE.<AuditLogMaxFiles>
// is deleted) and a new FILE is started. Files are created with mode 0600.

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

const (
	// auditBuffer is how many lines may wait for the writer.
	auditBuffer = 4096
	// auditWaitMax bounds a request's wait for room in a full buffer.
	auditWaitMax = 100 * time.Millisecond
	// Defaults of Config.AuditLogMaxBytes and AuditLogMaxFiles (zero).
	defaultAuditMaxBytes = 100 << 20
	defaultAuditMaxFiles = 10
	// denyLogEvery is the least time between two lines of refusals from
	// one remote IP (UNAUTHENTICATED) or, in the server's log, for one
	// identity (PERMISSION_DENIED); the lines in between are counted.
	denyLogEvery = 10 * time.Second
	// denyLimiterMax bounds the IPs and identities denyLogEvery tracks.
	denyLimiterMax = 10000
)

// auditLine is one line of the audit log.
type auditLine struct {
	Time     string `json:"time"`
	Node     string `json:"node"`
	Identity string `json:"identity"`
	// Via is the member (node ID) that forwarded the call on behalf of
	// Identity, whose certificate proved it; "" for a direct call.
	Via    string `json:"via,omitempty"`
	Remote string `json:"remote,omitempty"`
	Action string `json:"action"`
	Key    string `json:"key"`
	Reason string `json:"reason"`
	Result string `json:"result"`
	// Suppressed counts the refusals of the same remote IP (in the
	// server's log also: of the same identity) not written since its
	// previous line (see "Floods of refusals").
	Suppressed int `json:"suppressed,omitempty"`
}

// auditLog is the writer of Config.AuditLogFile.
type auditLog struct {
	events      *prometheus.CounterVec // action, result
	writeErrors prometheus.Counter
	lastWarn    atomic.Int64 // unix nanoseconds of the last warning logged

	mu     sync.RWMutex // guards ch against close while sending
	ch     chan []byte
	closed bool
	done   chan struct{}
	rot    *rotator

	byIP   *denyLimiter // UNAUTHENTICATED lines, per remote IP
	byName *denyLimiter // PERMISSION_DENIED lines of the server's log, per identity
}

// denyLimiter lets through one line per key (a remote IP, an identity)
// every `every`, and counts the others. It keeps at most max keys,
// evicting the one whose last line is the oldest.
type denyLimiter struct {
	every time.Duration
	max   int

	mu    sync.Mutex
	m     map[string]*list.Element // of *denyEntry
	order list.List                // least recently written first
}

type denyEntry struct {
	key        string
	last       time.Time // the last line written
	suppressed int       // lines not written since
}

func newDenyLimiter(every time.Duration, max int) *denyLimiter {
	return &denyLimiter{every: every, max: max, m: make(map[string]*list.Element)}
}

// admit reports whether a line for key may be written at now and, when it
// may, how many lines for key were suppressed since the last one written.
func (l *denyLimiter) admit(key string, now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if el := l.m[key]; el != nil {
		e := el.Value.(*denyEntry)
		if now.Sub(e.last) < l.every {
			e.suppressed++
			return false, 0
		}
		n := e.suppressed
		e.last, e.suppressed = now, 0
		l.order.MoveToBack(el)
		return true, n
	}
	for l.order.Len() >= l.max {
		old := l.order.Front()
		l.order.Remove(old)
		delete(l.m, old.Value.(*denyEntry).key)
	}
	l.m[key] = l.order.PushBack(&denyEntry{key: key, last: now})
	return true, 0
}

// remoteIP is the host part of a remote address ("10.0.0.7" of
// "10.0.0.7:50412"), or the address itself.
func remoteIP(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}

// initAudit registers the audit metrics; New calls it.
func (s *Server) initAudit() {
	a := &auditLog{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dlockd_audit_events_total",
			Help: "Audit events: admin actions (action force-release, cluster-add, cluster-remove, cluster-transfer-leader, auth-reload, tls-reload) and refusals (action deny), by result (ok, failed, or the answer's gRPC code).",
		}, []string{"action", "result"}),
		writeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dlockd_audit_write_errors_total",
			Help: "Audit lines not written to the audit log: the write failed, or the writer was too far behind.",
		}),
	}
	a.byIP = newDenyLimiter(denyLogEvery, denyLimiterMax)
	a.byName = newDenyLimiter(denyLogEvery, denyLimiterMax)
	s.metrics.reg.MustRegister(a.events, a.writeErrors)
	s.auth.audit = a
}

// startAudit opens Config.AuditLogFile and starts its writer; Start calls
// it.
func (s *Server) startAudit() error {
	if s.cfg.AuditLogFile == "" {
		return nil
	}
	maxBytes, maxFiles := s.cfg.AuditLogMaxBytes, s.cfg.AuditLogMaxFiles
	if maxBytes == 0 {
		maxBytes = defaultAuditMaxBytes
	}
	if maxFiles == 0 {
		maxFiles = defaultAuditMaxFiles
	}
	rot, err := openRotator(s.cfg.AuditLogFile, maxBytes, maxFiles)
	if err != nil {
		return fmt.Errorf("dlockd: audit log: %w", err)
	}
	a := s.auth.audit
	a.mu.Lock()
	a.rot, a.ch, a.done = rot, make(chan []byte, auditBuffer), make(chan struct{})
	a.mu.Unlock()
	go s.auditWriter(a)
	return nil
}

// stopAudit writes the lines still buffered and closes the file; teardown
// calls it. Later events are counted as write errors.
func (s *Server) stopAudit() {
	a := s.auth.audit
	a.mu.Lock()
	if a.ch == nil || a.closed {
		a.closed = true
		a.mu.Unlock()
		return
	}
	a.closed = true
	close(a.ch)
	a.mu.Unlock()
	<-a.done
	if err := a.rot.close(); err != nil {
		s.log.Warn("dlockd: audit log close", "file", s.cfg.AuditLogFile, "err", err)
	}
}

// auditWriter writes the lines of a.ch until it is closed.
func (s *Server) auditWriter(a *auditLog) {
	defer close(a.done)
	for line := range a.ch {
		if err := a.rot.write(line); err != nil {
			a.writeErrors.Inc()
			s.auditWarn("dlockd: audit line not written", "file", s.cfg.AuditLogFile, "err", err)
		}
	}
}

// auditWarn logs a warning at most once a second.
func (s *Server) auditWarn(msg string, args ...any) {
	a := s.auth.audit
	now := time.Now().UnixNano()
	last := a.lastWarn.Load()
	if now-last < int64(time.Second) || !a.lastWarn.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn(msg, args...)
}

// audit records one audit event: an admin action (action names it; result
// "ok" when err is nil) or a refusal (action "deny", err's code). reason
// is the operator's reason or the refusal's message. Refusals are
// aggregated as "Floods of refusals" says; every event is counted. It
// never blocks for more than auditWaitMax.
func (s *Server) audit(ctx context.Context, action, key, reason string, err error) {
	a := s.auth.audit
	result := auditResult(err)
	label := action
	refusal := action == "deny" || action == ""
	if result == "PERMISSION_DENIED" || result == "UNAUTHENTICATED" {
		label = "deny"
		if refusal {
			action = operation(ctx)
		}
	}
	a.events.WithLabelValues(label, result).Inc()
	now := time.Now()
	l := auditLine{
		Time:     now.UTC().Format(time.RFC3339Nano),
		Node:     s.cfg.NodeID,
		Identity: identityName(ctx),
		Via:      viaOf(ctx),
		Remote:   remoteOf(ctx),
		Action:   action,
		Key:      key,
		Reason:   reason,
		Result:   result,
	}
	logLine := true // the line may go to the server's log (no audit file)
	if refusal {
		switch result {
		case "UNAUTHENTICATED":
			ok, n := a.byIP.admit(remoteIP(l.Remote), now)
			if !ok {
				return
			}
			l.Suppressed = n
		case "PERMISSION_DENIED":
			if s.cfg.AuditLogFile == "" { // every line to the file; the server's log is limited
				ok, n := a.byName.admit(l.Identity, now)
				logLine, l.Suppressed = ok, n
			}
		}
	}
	b, merr := json.Marshal(l)
	if merr != nil { // strings only: cannot happen
		a.writeErrors.Inc()
		return
	}
	b = append(b, '\n')
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.ch == nil {
		if a.closed {
			a.writeErrors.Inc()
			return
		}
		if !logLine {
			return
		}
		args := []any{"identity", l.Identity, "via", l.Via, "remote", l.Remote, "action", l.Action, "key", l.Key, "reason", l.Reason, "result", l.Result}
		if l.Suppressed > 0 {
			args = append(args, "suppressed", l.Suppressed)
		}
		s.log.Info("dlockd: audit", args...)
		return
	}
	if a.closed {
		a.writeErrors.Inc()
		return
	}
	select {
	case a.ch <- b:
		return
	default:
	}
	t := time.NewTimer(auditWaitMax)
	defer t.Stop()
	select {
	case a.ch <- b:
	case <-t.C:
		a.writeErrors.Inc()
		s.auditWarn("dlockd: audit log writer too far behind; line dropped", "file", s.cfg.AuditLogFile, "action", l.Action, "identity", l.Identity, "key", l.Key, "result", l.Result)
	}
}

// auditResult is the result field for err: "ok", the gRPC code's name, or
// "failed" for an error that is not an API answer.
func auditResult(err error) string {
	if err == nil {
		return "ok"
	}
	var ae *apiError
	if errors.As(err, &ae) {
		return codeName(ae.code)
	}
	if st, ok := status.FromError(err); ok {
		return codeName(st.Code())
	}
	return "failed"
}

// callInfoKey is the context key of an HTTP request's remote address and
// operation (the gRPC ones come from grpc-go's context).
type callInfoKey struct{}

type callInfo struct{ remote, op string }

// withRemote returns ctx carrying an HTTP request's remote address.
func withRemote(ctx context.Context, remote string) context.Context {
	return context.WithValue(ctx, callInfoKey{}, callInfo{remote: remote})
}

// withOperation returns ctx carrying an HTTP request's method and path,
// for audit lines.
func withOperation(ctx context.Context, op string) context.Context {
	ci, _ := ctx.Value(callInfoKey{}).(callInfo)
	if len(op) > 256 {
		op = op[:256]
	}
	ci.op = op
	return context.WithValue(ctx, callInfoKey{}, ci)
}

// remoteOf is the caller's address, or "".
func remoteOf(ctx context.Context) string {
	if ci, ok := ctx.Value(callInfoKey{}).(callInfo); ok && ci.remote != "" {
		return ci.remote
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// operation names ctx's call: "Lock/Acquire" (gRPC) or "POST /v1/acquire"
// (HTTP), or "".
func operation(ctx context.Context) string {
	if ci, ok := ctx.Value(callInfoKey{}).(callInfo); ok && ci.op != "" {
		return ci.op
	}
	if m, ok := grpc.Method(ctx); ok {
		if len(m) > 0 && m[0] == '/' {
			m = m[1:]
		}
		const pkg = "dlock.v1."
		if len(m) > len(pkg) && m[:len(pkg)] == pkg {
			m = m[len(pkg):]
		}
		return m
	}
	return ""
}

// rotator appends to a file and rotates it by size: FILE, FILE.1 (the
// newest rotated), ..., FILE.<keep>.
type rotator struct {
	path     string
	maxBytes int64
	keep     int
	f        *os.File
	size     int64
}

func openRotator(path string, maxBytes int64, keep int) (*rotator, error) {
	r := &rotator{path: path, maxBytes: maxBytes, keep: keep}
	if err := r.open(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *rotator) open() error {
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return err
	}
	r.f, r.size = f, st.Size()
	return nil
}

// write appends line, rotating first when it would pass maxBytes (a
// line longer than maxBytes gets a file of its own).
func (r *rotator) write(line []byte) error {
	if r.f == nil {
		if err := r.open(); err != nil {
			return err
		}
	}
	if r.size > 0 && r.size+int64(len(line)) > r.maxBytes {
		if err := r.rotate(); err != nil {
			return err
		}
	}
	n, err := r.f.Write(line)
	r.size += int64(n)
	return err
}

// rotate shifts FILE.i to FILE.i+1 (deleting FILE.keep), FILE to FILE.1,
// and opens a new FILE.
func (r *rotator) rotate() error {
	if err := r.f.Close(); err != nil {
		r.f = nil
		return err
	}
	r.f = nil
	_ = os.Remove(r.path + "." + strconv.Itoa(r.keep))
	for i := r.keep - 1; i >= 1; i-- {
		from := r.path + "." + strconv.Itoa(i)
		if _, err := os.Stat(from); err == nil {
			if err := os.Rename(from, r.path+"."+strconv.Itoa(i+1)); err != nil {
				return err
			}
		}
	}
	if err := os.Rename(r.path, r.path+".1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return r.open()
}

func (r *rotator) close() error {
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}
