package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
	"github.com/dlock-dev/dlock/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// rawCodec sends a []byte as the message as it is, so a test can send
// bytes that are not the method's protobuf message.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// reasonOf returns the reason an API error's message ends with.
func reasonOf(err error) string {
	m := status.Convert(err).Message()
	if i := strings.LastIndex(m, " ("); i >= 0 && strings.HasSuffix(m, ")") {
		return m[i+2 : len(m)-1]
	}
	return ""
}

// TestServer_MalformedProtobufIsInvalidArgument: bytes that are not the
// method's message (a truncated field, a string that is not UTF-8, a wrong
// wire type), on a unary call and on a stream, are answered
// INVALID_ARGUMENT with reason INVALID_REQUEST, not grpc-go's INTERNAL,
// change nothing, and the server serves the next call.
func TestServer_MalformedProtobufIsInvalidArgument(t *testing.T) {
	srv := start(t, nil)
	cc, err := grpc.NewClient("passthrough:///"+srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	bad := map[string][]byte{
		"truncated field":  {0x0a, 0x05, 'k'},
		"wrong wire type":  {0x0d, 1, 2, 3, 4, 0x0a, 0x01},
		"unterminated tag": {0x80},
		// Field 1 is a string (the key) in each message below but
		// SessionRequest and ClusterStatusRequest.
		"key not UTF-8": {0x0a, 0x02, 0xff, 0xfe},
	}
	for name, b := range bad {
		unary := []string{"/dlock.v1.Lock/Acquire", "/dlock.v1.Lock/Release", "/dlock.v1.Lock/Inspect", "/dlock.v1.Cluster/Status"}
		streams := []string{"Session", "Wait"}
		if name == "key not UTF-8" {
			unary, streams = unary[:3], streams[1:]
		}
		for _, method := range unary {
			var out []byte
			err := cc.Invoke(ctx, method, &b, &out, grpc.ForceCodecV2(rawCodec{}))
			if status.Code(err) != codes.InvalidArgument || reasonOf(err) != server.ReasonInvalidRequest {
				t.Errorf("%s to %s: %v (reason %q), want INVALID_ARGUMENT %s", name, method, err, reasonOf(err), server.ReasonInvalidRequest)
			}
		}
		for _, method := range streams {
			desc := &grpc.StreamDesc{StreamName: method, ClientStreams: true, ServerStreams: true}
			st, err := cc.NewStream(ctx, desc, "/dlock.v1.Lock/"+method, grpc.ForceCodecV2(rawCodec{}))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.SendMsg(&b); err != nil {
				t.Fatal(err)
			}
			var out []byte
			err = st.RecvMsg(&out)
			if status.Code(err) != codes.InvalidArgument || reasonOf(err) != server.ReasonInvalidRequest {
				t.Errorf("%s on a %s stream: %v (reason %q), want INVALID_ARGUMENT %s", name, method, err, reasonOf(err), server.ReasonInvalidRequest)
			}
		}
	}
	c := dlockv1.NewLockClient(cc)
	in, err := c.Inspect(ctx, &dlockv1.InspectRequest{Key: "k"})
	if err != nil || in.GetHeld() {
		t.Fatalf("after the malformed requests: inspect %v %v, want k free", in, err)
	}
	if _, err := c.Acquire(ctx, &dlockv1.AcquireRequest{Key: "k", Owner: "owner-a-0000", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatalf("a valid acquisition after the malformed requests: %v", err)
	}
}
