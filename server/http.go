package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/pprof"
	"strconv"

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
}

// newHTTPHandler serves the JSON API, /healthz, /readyz and /metrics.
//
// JSON routes (POST, body = the request message in protobuf JSON):
// /v1/acquire, /v1/renew, /v1/release, /v1/cancel-wait, /v1/check-fence,
// /v1/inspect, /v1/list. GET /v1/inspect?key=K and GET
// /v1/list?prefix=P&limit=N also work. Errors are
// {"code":"FAILED_PRECONDITION","reason":"LOCK_HELD","message":"..."} with
// the HTTP status of the code (400, 404, 409, 413, 429, 503, ...).
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
	mux.HandleFunc("GET /v1/inspect", func(w http.ResponseWriter, r *http.Request) {
		resp, err := a.Inspect(r.Context(), &dlockv1.InspectRequest{Key: r.URL.Query().Get("key")})
		s.metrics.countHTTP("inspect", err)
		writeReply(w, resp, err)
	})
	mux.HandleFunc("GET /v1/list", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var limit uint64
		if l := q.Get("limit"); l != "" {
			var err error
			if limit, err = strconv.ParseUint(l, 10, 32); err != nil {
				writeReply(w, nil, apiErr(codes.InvalidArgument, ReasonInvalidRequest, "limit %q: %v", l, err))
				return
			}
		}
		resp, err := a.List(r.Context(), &dlockv1.ListRequest{Prefix: q.Get("prefix"), Limit: uint32(limit)})
		s.metrics.countHTTP("list", err)
		writeReply(w, resp, err)
	})
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
	return mux
}

// unary serves one JSON route: decode (bounded by MaxRequestBytes), call,
// encode.
func unary[Req, Resp proto.Message](s *Server, name string, newReq func() Req, call func(context.Context, Req) (Resp, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.cfg.MaxRequestBytes)))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				s.metrics.countHTTP(name, errTooLarge)
				writeError(w, http.StatusRequestEntityTooLarge, errTooLarge.(*apiError))
				return
			}
			writeReply(w, nil, apiErr(codes.InvalidArgument, ReasonInvalidRequest, "read body: %v", err))
			return
		}
		req := newReq()
		if len(body) > 0 {
			if err := protojson.Unmarshal(body, req); err != nil {
				err = apiErr(codes.InvalidArgument, ReasonInvalidRequest, "malformed JSON request: %v", err)
				s.metrics.countHTTP(name, err)
				writeReply(w, nil, err)
				return
			}
		}
		resp, err := call(r.Context(), req)
		s.metrics.countHTTP(name, err)
		writeReply(w, resp, err)
	})
}

var errTooLarge = apiErr(codes.ResourceExhausted, ReasonTooLarge, "request body too large")

var jsonOut = protojson.MarshalOptions{EmitUnpopulated: true, UseProtoNames: true}

func writeReply(w http.ResponseWriter, resp proto.Message, err error) {
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
		return
	}
	b, merr := jsonOut.Marshal(resp)
	if merr != nil {
		http.Error(w, merr.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, ae *apiError) {
	b, _ := json.Marshal(struct {
		Code    string `json:"code"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}{codeName(ae.code), ae.reason, ae.Error()})
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
	default:
		return "INTERNAL"
	}
}
