package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"os"
	"regexp"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// httpStatus maps gRPC codes to HTTP statuses for the JSON API.
var httpStatus = map[codes.Code]int{
	codes.OK:                 http.StatusOK,
	codes.InvalidArgument:    http.StatusBadRequest,
	codes.FailedPrecondition: http.StatusConflict,
	codes.AlreadyExists:      http.StatusConflict,
	codes.NotFound:           http.StatusNotFound,
	codes.ResourceExhausted:  http.StatusTooManyRequests,
	codes.Unavailable:        http.StatusServiceUnavailable,
	codes.Canceled:           499,
	codes.DeadlineExceeded:   http.StatusGatewayTimeout,
	codes.Internal:           http.StatusInternalServerError,
	codes.Unauthenticated:    http.StatusUnauthorized, // auth.go (issue 12)
	codes.PermissionDenied:   http.StatusForbidden,
}

// newHTTPHandler serves the JSON API, /healthz, /readyz and /metrics.
//
// JSON routes (POST, body = the request message in protobuf JSON):
// /v1/acquire, /v1/renew, /v1/release, /v1/cancel-wait, /v1/check-fence,
// /v1/inspect, /v1/list. GET /v1/inspect?key=K and GET
// /v1/list?prefix=P&limit=N&page_token=T also work. Errors are
// {"code":"FAILED_PRECONDITION","reason":"LOCK_HELD","message":"..."} with
// the HTTP status of the code (400, 404, 409, 413, 429, 503, ...); a
// NOT_LEADER answer (503) adds "leader" (the leader's API address) and
// "leader_id", and the header Dlock-Leader.
//
// On a node that is not the leader, the /v1/ routes are forwarded to the
// leader (marked Dlock-Forwarded: 1), or redirected there (307) for a
// request with Dlock-No-Forward: 1; see httpForwarder. /healthz, /readyz
// and /metrics always answer for this node.
func newHTTPHandler(s *Server) http.Handler {
	a := &api{s: s}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/acquire", unary(s, "acquire", func() *dlockv1.AcquireRequest { return new(dlockv1.AcquireRequest) }, a.Acquire))
	mux.Handle("POST /v1/renew", unary(s, "renew", func() *dlockv1.RenewRequest { return new(dlockv1.RenewRequest) }, a.Renew))
	mux.Handle("POST /v1/release", unary(s, "release", func() *dlockv1.ReleaseRequest { return new(dlockv1.ReleaseRequest) }, a.Release))
	mux.Handle("POST /v1/cancel-wait", unary(s, "cancel-wait", func() *dlockv1.CancelWaitRequest { return new(dlockv1.CancelWaitRequest) }, a.CancelWait))
	mux.Handle("POST /v1/check-fence", unary(s, "check-fence", func() *dlockv1.CheckFenceRequest { return new(dlockv1.CheckFenceRequest) }, a.CheckFence))
	mux.Handle("POST /v1/inspect", unary(s, "inspect", func() *dlockv1.InspectRequest { return new(dlockv1.InspectRequest) }, a.Inspect))
	mux.Handle("POST /v1/list", unary(s, "list", func() *dlockv1.ListRequest { return new(dlockv1.ListRequest) }, a.List))
	mux.Handle("POST /v1/force-release", unary(s, "force-release", func() *dlockv1.ForceReleaseRequest { return new(dlockv1.ForceReleaseRequest) }, a.ForceRelease))
	mux.HandleFunc("GET /v1/inspect", func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		key := r.URL.Query().Get("key")
		resp, err := a.Inspect(r.Context(), &dlockv1.InspectRequest{Key: key})
		s.requestDone(transportHTTP, "inspect", key, err, start)
		writeReply(w, resp, err)
	})
	mux.HandleFunc("GET /v1/list", func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		q := r.URL.Query()
		var limit uint64
		if l := q.Get("limit"); l != "" {
			var err error
			if limit, err = strconv.ParseUint(l, 10, 32); err != nil {
				err = apiErr(codes.InvalidArgument, ReasonInvalidRequest, "limit %q: %v", l, err)
				s.requestDone(transportHTTP, "list", "", err, start)
				writeReply(w, nil, err)
				return
			}
		}
		resp, err := a.List(r.Context(), &dlockv1.ListRequest{Prefix: q.Get("prefix"), Limit: uint32(limit), PageToken: q.Get("page_token")})
		s.requestDone(transportHTTP, "list", "", err, start)
		writeReply(w, resp, err)
	})
	clusterRoutes(s, mux) // /v1/cluster/* (cluster_http.go)
	uiRoutes(s, mux)      // /ui/ and /ui/api/* (ui.go)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-s.closing:
			http.Error(w, "shutting down\n", http.StatusServiceUnavailable)
		default:
			_, _ = io.WriteString(w, "ok\n")
		}
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.writable(); err != nil {
			http.Error(w, err.Error()+"\n", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	if s.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	// A node that is not the leader forwards the /v1/ routes to it, after
	// the caller is authenticated (auth.go).
	// Before that, a client certificate when --tls-client-ca asks for one
	// (tls.go).
	return s.recoverHTTP(s.requireClientCertHTTP(s.authHTTP(newHTTPForwarder(s, mux))))
}

// unary serves one JSON route: read the body (bounded by MaxRequestBytes
// and HTTPBodyTimeout), decode, call, encode. An acquisition with wait
// counts against MaxWaitingRequests while it runs.
func unary[Req, Resp proto.Message](s *Server, name string, newReq func() Req, call func(context.Context, Req) (Resp, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		callPanicHook(r.Method + " " + r.URL.Path)
		body, status, berr := readBody(s, w, r)
		if berr != nil {
			s.requestDone(transportHTTP, name, "", berr, start)
			writeError(w, status, berr)
			return
		}
		req := newReq()
		if len(body) > 0 {
			if err := jsonIn.Unmarshal(body, req); err != nil {
				err = jsonError(body, err)
				s.requestDone(transportHTTP, name, "", err, start)
				writeReply(w, nil, err)
				return
			}
		}
		if ar, ok := any(req).(*dlockv1.AcquireRequest); ok && ar.GetWait() {
			release, err := s.limits().takeWaiting()
			if err != nil {
				s.requestDone(transportHTTP, name, keyOf(req), err, start)
				writeReply(w, nil, err)
				return
			}
			defer release()
		}
		resp, err := call(r.Context(), req)
		s.requestDone(transportHTTP, name, keyOf(req), err, start)
		werr := writeReply(w, resp, err)
		if g, ok := any(resp).(*dlockv1.AcquireResponse); ok && err == nil && g.GetClaimWithin() != nil {
			// A grant handed over after a wait that did not reach its
			// receiver is released at once, not after the claim window.
			if werr == nil {
				werr = http.NewResponseController(w).Flush()
			}
			if werr != nil {
				_ = s.undo(keyOwner{g.GetKey(), g.GetOwner()})
			}
		}
	})
}

// readBody reads r's body, at most MaxRequestBytes (else 413
// REQUEST_TOO_LARGE, at once when the Content-Length says so) within
// HTTPBodyTimeout (else 408 BODY_TIMEOUT). The
// read deadline is cleared afterwards so that it never bounds the
// long-poll wait that may follow. (net/http clears it too when it starts
// its background read, the one that notices a client going away, at the
// body's end; this does not rely on it.)
func readBody(s *Server, w http.ResponseWriter, r *http.Request) (body []byte, status int, err *apiError) {
	if r.ContentLength > int64(s.cfg.MaxRequestBytes) {
		// Declared too large: answered at once, not after reading (or
		// waiting HTTPBodyTimeout for) a body that would be refused. The
		// body is not read, so the connection cannot carry another
		// request.
		w.Header().Set("Connection", "close")
		return nil, http.StatusRequestEntityTooLarge, errTooLarge.(*apiError)
	}
	rc := http.NewResponseController(w)
	// Not every ResponseWriter supports deadlines (httptest's does not):
	// then the body is read without one.
	hasDeadline := rc.SetReadDeadline(time.Now().Add(s.cfg.HTTPBodyTimeout)) == nil
	body, rerr := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.cfg.MaxRequestBytes)))
	if hasDeadline {
		_ = rc.SetReadDeadline(time.Time{})
	}
	if rerr == nil {
		return body, 0, nil
	}
	var tooBig *http.MaxBytesError
	if errors.As(rerr, &tooBig) {
		return nil, http.StatusRequestEntityTooLarge, errTooLarge.(*apiError)
	}
	if errors.Is(rerr, os.ErrDeadlineExceeded) {
		s.limits().refused(limitHTTPBodyTimeout, fmt.Sprintf("%s %s from %s: body not received within %v", r.Method, r.URL.Path, r.RemoteAddr, s.cfg.HTTPBodyTimeout))
		w.Header().Set("Connection", "close")
		return nil, http.StatusRequestTimeout, &apiError{code: codes.DeadlineExceeded, reason: ReasonBodyTimeout,
			msg: fmt.Sprintf("request body not received within %v", s.cfg.HTTPBodyTimeout)}
	}
	return nil, http.StatusBadRequest, &apiError{code: codes.InvalidArgument, reason: ReasonInvalidRequest, msg: fmt.Sprintf("read body: %v", rerr)}
}

// jsonIn decodes JSON requests. Unknown fields are ignored, as protobuf's
// binary decoding (gRPC) ignores unknown fields: a client built against a
// newer proto keeps working.
var jsonIn = protojson.UnmarshalOptions{DiscardUnknown: true}

// durationErr matches protojson's complaint about a duration's text.
var durationErr = regexp.MustCompile(`\(line (\d+):(\d+)\): invalid google\.protobuf\.Duration value ("(?:[^"\\]|\\.)*")`)

// jsonError turns a protojson decoding error of body into INVALID_REQUEST,
// or INVALID_TTL for a malformed "ttl". A malformed duration gets its
// format explained: protobuf JSON writes one as a decimal number of
// seconds with an "s" suffix ("0.001s", "30s", "1.5s"), not as Go's "1ms"
// or "1m".
func jsonError(body []byte, err error) error {
	m := durationErr.FindStringSubmatch(err.Error())
	if m == nil {
		return apiErr(codes.InvalidArgument, ReasonInvalidRequest, "malformed JSON request: %v", err)
	}
	line, _ := strconv.Atoi(m[1])
	col, _ := strconv.Atoi(m[2])
	field := jsonFieldAt(body, line, col)
	reason, what := ReasonInvalidRequest, "duration"
	if field != "" {
		what = fmt.Sprintf("%q", field)
	}
	if field == "ttl" {
		reason = ReasonInvalidTTL
	}
	hint := `e.g. "30s" or "0.5s"`
	if v, uerr := strconv.Unquote(m[3]); uerr == nil {
		if d, perr := time.ParseDuration(v); perr == nil {
			hint = fmt.Sprintf("here %q", durationpbJSON(d))
		}
	}
	return apiErr(codes.InvalidArgument, reason,
		`invalid %s %s (line %s:%s): a protobuf JSON duration is a decimal number of seconds with an "s" suffix, %s`,
		what, m[3], m[1], m[2], hint)
}

// durationpbJSON writes d as protobuf JSON does: seconds with up to 9
// decimals and an "s".
func durationpbJSON(d time.Duration) string {
	s := strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
	return s + "s"
}

// jsonFieldAt returns the name of the JSON object member whose value starts
// at line:col of body (1-based; col counts runes, as protojson's positions
// do), or "" when it cannot tell.
func jsonFieldAt(body []byte, line, col int) string {
	off := 0
	for l := 1; l < line; l++ {
		i := bytes.IndexByte(body[off:], '\n')
		if i < 0 {
			return ""
		}
		off += i + 1
	}
	for c := 1; c < col && off < len(body); c++ {
		_, size := utf8.DecodeRune(body[off:])
		off += size
	}
	// Back over blanks, the colon, blanks, then the quoted name.
	i := off - 1
	for i >= 0 && isJSONSpace(body[i]) {
		i--
	}
	if i < 0 || body[i] != ':' {
		return ""
	}
	i--
	for i >= 0 && isJSONSpace(body[i]) {
		i--
	}
	if i < 0 || body[i] != '"' {
		return ""
	}
	end := i
	i--
	for i >= 0 && (body[i] != '"' || (i > 0 && body[i-1] == '\\')) {
		i--
	}
	if i < 0 {
		return ""
	}
	name, err := strconv.Unquote(string(body[i : end+1]))
	if err != nil {
		return ""
	}
	return name
}

func isJSONSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

var errTooLarge = apiErr(codes.ResourceExhausted, ReasonTooLarge, "request body too large")

var jsonOut = protojson.MarshalOptions{EmitUnpopulated: true, UseProtoNames: true}

// writeReply writes resp, or err as a JSON error with the HTTP status of
// its code, and returns the error of the write.
func writeReply(w http.ResponseWriter, resp proto.Message, err error) error {
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			ae = &apiError{code: codes.Internal, reason: ReasonInternal, msg: err.Error()}
		}
		code, ok := httpStatus[ae.code]
		if !ok {
			code = http.StatusInternalServerError
		}
		writeError(w, code, ae)
		return nil
	}
	b, merr := jsonOut.Marshal(resp)
	if merr != nil {
		http.Error(w, merr.Error(), http.StatusInternalServerError)
		return merr
	}
	w.Header().Set("Content-Type", "application/json")
	_, werr := w.Write(append(b, '\n'))
	return werr
}

// writeError writes ae as a JSON error with HTTP status status. A
// NOT_LEADER answer also carries the leader as this node knows it: the
// "leader" (API address) and "leader_id" fields, and the Dlock-Leader
// header, empty when unknown. A hint that names the node that answered
// means it is the leader still catching up: retry after a pause.
func writeError(w http.ResponseWriter, status int, ae *apiError) {
	body := struct {
		Code     string  `json:"code"`
		Reason   string  `json:"reason"`
		Message  string  `json:"message"`
		Leader   *string `json:"leader,omitempty"`
		LeaderID *string `json:"leader_id,omitempty"`
	}{Code: codeName(ae.code), Reason: ae.reason, Message: ae.Error()}
	if h := ae.leader; h != nil {
		body.Leader, body.LeaderID = &h.api, &h.id
		w.Header().Set(HeaderLeader, h.api)
	}
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// codeName spells a code as in the gRPC spec (FAILED_PRECONDITION).
func codeName(c codes.Code) string {
	switch c {
	case codes.OK:
		return "OK"
	case codes.Canceled:
		return "CANCELLED"
	case codes.InvalidArgument:
		return "INVALID_ARGUMENT"
	case codes.DeadlineExceeded:
		return "DEADLINE_EXCEEDED"
	case codes.NotFound:
		return "NOT_FOUND"
	case codes.AlreadyExists:
		return "ALREADY_EXISTS"
	case codes.ResourceExhausted:
		return "RESOURCE_EXHAUSTED"
	case codes.FailedPrecondition:
		return "FAILED_PRECONDITION"
	case codes.Unavailable:
		return "UNAVAILABLE"
	case codes.Unauthenticated:
		return "UNAUTHENTICATED"
	case codes.PermissionDenied:
		return "PERMISSION_DENIED"
	default:
		return "INTERNAL"
	}
}
