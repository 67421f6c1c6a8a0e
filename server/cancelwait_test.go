package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// TestCancelWait_EndsTheWaitingRequest: a CancelWait sent on another call
// (POST /v1/cancel-wait, or the unary gRPC call from another connection)
// removes the queue entry and ends the request that was waiting on it at
// once, over HTTP (a long poll) and over a gRPC Wait stream. Before, the
// long poll went on waiting for a grant that could no longer come, until
// its client gave up.
func TestCancelWait_EndsTheWaitingRequest(t *testing.T) {
	srv := start(t, nil)
	addr := srv.Addr()
	code, granted := post(t, addr, "/v1/acquire", `{"key":"cw","owner":"holder-0123456789","ttl":"30s"}`)
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, granted)
	}
	waiters := func() float64 {
		_, m := post(t, addr, "/v1/inspect", `{"key":"cw"}`)
		n, _ := m["waiters"].(float64)
		return n
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// HTTP long poll, cancelled by POST /v1/cancel-wait.
	type answer struct {
		code int
		m    map[string]any
		took time.Duration
	}
	done := make(chan answer, 1)
	go func() {
		t0 := time.Now()
		code, m := postNoFatal(addr, "/v1/acquire", `{"key":"cw","owner":"waiter-http-0123456","ttl":"30s","wait":true}`)
		done <- answer{code, m, time.Since(t0)}
	}()
	waitFor("the HTTP waiter to queue", func() bool { return waiters() == 1 })
	t0 := time.Now()
	if code, m := post(t, addr, "/v1/cancel-wait", `{"key":"cw","owner":"waiter-http-0123456"}`); code != 200 || m["dequeued"] != true {
		t.Fatalf("cancel-wait: %d %v, want 200 dequeued", code, m)
	}
	select {
	case a := <-done:
		if a.code == 200 || a.m["reason"] != "CANCELLED" || !strings.Contains(a.m["message"].(string), "removed") {
			t.Fatalf("long poll answered %d %v, want CANCELLED naming the removed entry", a.code, a.m)
		}
		t.Logf("long poll ended %v after the cancel-wait", time.Since(t0).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the long poll still waits 5s after its queue entry was removed")
	}
	if n := waiters(); n != 0 {
		t.Fatalf("waiters after cancel: %v", n)
	}

	// gRPC Wait stream, cancelled by a unary CancelWait from another
	// connection.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := grpcClient(t, addr).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Send(&dlockv1.AcquireRequest{Key: "cw", Owner: "waiter-grpc-0123456", Wait: true}); err != nil {
		t.Fatal(err)
	}
	waitFor("the gRPC waiter to queue", func() bool { return waiters() == 1 })
	if _, err := grpcClient(t, addr).CancelWait(ctx, &dlockv1.CancelWaitRequest{Key: "cw", Owner: "waiter-grpc-0123456"}); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := ws.Recv()
		if err == nil {
			if ev.GetType() == dlockv1.WaitEvent_GRANTED {
				t.Fatalf("granted after its entry was removed: %v", ev)
			}
			continue // the queued event
		}
		if status.Code(err) != codes.Canceled || !strings.Contains(err.Error(), "removed") {
			t.Fatalf("Wait stream ended with %v, want CANCELLED naming the removed entry", err)
		}
		break
	}
	// The holder still holds; the key is not granted to anyone else.
	_, m := post(t, addr, "/v1/inspect", `{"key":"cw"}`)
	if info, _ := m["info"].(map[string]any); m["held"] != true || info["fence"] != granted["fence"] {
		t.Fatalf("inspect after the cancels: %v", m)
	}
}

// postNoFatal is post for a goroutine other than the test's: it reports a
// failure in the answer (code 0) instead of calling t.Fatal.
func postNoFatal(addr, path, body string) (int, map[string]any) {
	resp, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, map[string]any{"error": err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return 0, map[string]any{"error": string(b)}
	}
	return resp.StatusCode, m
}
