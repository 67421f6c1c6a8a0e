package server

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// requestCodec is the API's gRPC codec: grpc-go's protobuf codec, except
// that a request that does not decode (bytes that are not the method's
// message: a truncated field, invalid UTF-8 in a string, a wrong wire type)
// is answered INVALID_ARGUMENT with reason INVALID_REQUEST, as a malformed
// JSON body is, and never reaches a handler. grpc-go answers every decode
// failure INTERNAL, which would tell the client that the server failed, and
// a client may retry that.
//
// grpc-go turns any error of Unmarshal into INTERNAL, so Unmarshal reports
// success and remembers the message whose decoding failed; the interceptors
// (checkDecodedUnary first after recovery, checkDecodedStream around every
// stream's RecvMsg) look the message up as soon as the call has it and
// answer the error. Each entry is removed when looked up: grpc-go hands
// every decoded request to the interceptor chain (unary) or back to the
// RecvMsg that asked (streams) at once.
type requestCodec struct {
	base encoding.CodecV2
	bad  sync.Map // decoded message (a pointer) -> its decode error
}

func newRequestCodec() *requestCodec {
	return &requestCodec{base: encoding.GetCodecV2(proto.Name)}
}

// Name implements encoding.CodecV2.
func (c *requestCodec) Name() string { return c.base.Name() }

// Marshal implements encoding.CodecV2.
func (c *requestCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

// Unmarshal implements encoding.CodecV2: see requestCodec.
func (c *requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if err := c.base.Unmarshal(data, v); err != nil {
		c.bad.Store(v, err)
	}
	return nil
}

// take returns the INVALID_ARGUMENT error for msg when it did not decode,
// and forgets it; nil otherwise.
func (c *requestCodec) take(msg any) error {
	if err, ok := c.bad.LoadAndDelete(msg); ok {
		return apiErr(codes.InvalidArgument, ReasonInvalidRequest, "malformed request: %v", err)
	}
	return nil
}

// checkDecodedUnary refuses a unary request that did not decode.
func (c *requestCodec) checkDecodedUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := c.take(req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// checkDecodedStream makes every RecvMsg of the stream refuse a message
// that did not decode; the handler then ends the stream with that error.
func (c *requestCodec) checkDecodedStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, decodeCheckedStream{ServerStream: ss, c: c})
}

type decodeCheckedStream struct {
	grpc.ServerStream
	c *requestCodec
}

// RecvMsg implements grpc.ServerStream.
func (s decodeCheckedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.c.take(m)
}
