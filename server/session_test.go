package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// TestServer_Session: calls on one Session stream have the meaning of their
// unary RPCs, errors included; waits are refused; the stream ends with
// UNAVAILABLE when the server shuts down.
func TestServer_Session(t *testing.T) {
	e := start(t, nil)
	c := grpcClient(t, e.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	call := func(req *dlockv1.SessionRequest) *dlockv1.SessionResponse {
		t.Helper()
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetId() != req.GetId() {
			t.Fatalf("response id %d, want %d", resp.GetId(), req.GetId())
		}
		return resp
	}
	acq := func(owner string, wait bool) *dlockv1.AcquireRequest {
		return &dlockv1.AcquireRequest{Key: "s", Owner: owner, Ttl: durationpb.New(time.Minute), Wait: wait}
	}

	r := call(&dlockv1.SessionRequest{Id: 1, Call: &dlockv1.SessionRequest_Acquire{Acquire: acq("owner-a-0123456789", false)}})
	if r.GetCode() != 0 || r.GetAcquire().GetFence() == 0 {
		t.Fatalf("acquire: %+v", r)
	}
	fence := r.GetAcquire().GetFence()
	r = call(&dlockv1.SessionRequest{Id: 2, Call: &dlockv1.SessionRequest_Acquire{Acquire: acq("owner-b-0123456789", false)}})
	if codes.Code(r.GetCode()) != codes.FailedPrecondition || r.GetMessage() == "" {
		t.Fatalf("held: %+v", r)
	}
	r = call(&dlockv1.SessionRequest{Id: 3, Call: &dlockv1.SessionRequest_Acquire{Acquire: acq("owner-b-0123456789", true)}})
	if codes.Code(r.GetCode()) != codes.InvalidArgument {
		t.Fatalf("wait on a session: %+v", r)
	}
	r = call(&dlockv1.SessionRequest{Id: 4, Call: &dlockv1.SessionRequest_Renew{Renew: &dlockv1.RenewRequest{Items: []*dlockv1.RenewItem{{Key: "s", Owner: "owner-a-0123456789"}}}}})
	if r.GetCode() != 0 || len(r.GetRenew().GetResults()) != 1 || !r.GetRenew().GetResults()[0].GetOk() {
		t.Fatalf("renew: %+v", r)
	}
	// A cancel of a call that is not running is ignored.
	if err := st.Send(&dlockv1.SessionRequest{Id: 99, Call: &dlockv1.SessionRequest_Cancel{Cancel: true}}); err != nil {
		t.Fatal(err)
	}
	r = call(&dlockv1.SessionRequest{Id: 5, Call: &dlockv1.SessionRequest_Release{Release: &dlockv1.ReleaseRequest{Key: "s", Owner: "owner-a-0123456789"}}})
	if r.GetCode() != 0 {
		t.Fatalf("release: %+v", r)
	}
	r = call(&dlockv1.SessionRequest{Id: 6, Call: &dlockv1.SessionRequest_Release{Release: &dlockv1.ReleaseRequest{Key: "s", Owner: "owner-a-0123456789"}}})
	if codes.Code(r.GetCode()) != codes.NotFound {
		t.Fatalf("second release: %+v", r)
	}
	r = call(&dlockv1.SessionRequest{Id: 7, Call: &dlockv1.SessionRequest_Acquire{Acquire: acq("owner-b-0123456789", false)}})
	if r.GetCode() != 0 || r.GetAcquire().GetFence() <= fence {
		t.Fatalf("acquire after release: %+v (fence %d)", r, fence)
	}

	// Shutdown ends the stream.
	done := make(chan error, 1)
	go func() { _, err := st.Recv(); done <- err }()
	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("stream still open after shutdown")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stream not ended by shutdown")
	}
}
