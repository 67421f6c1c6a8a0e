package dlockddriver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-dev/dlock/driver"
	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// notLeaderErr is a NOT_LEADER answer as the server builds it: code
// Unavailable, the reason code ending the message, and an ErrorInfo detail
// with the leader's API address (none when api is "-").
func notLeaderErr(t *testing.T, api string) error {
	t.Helper()
	st := status.New(codes.Unavailable, "dlockd: not the leader (leader: \"127.0.0.1:9999\") (NOT_LEADER)")
	if api == "-" {
		return st.Err()
	}
	st, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason: "NOT_LEADER", Domain: "dlockd",
		Metadata: map[string]string{"leader_id": "n2", "leader_api": api},
	})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// TestLeaderHint: the hint is read from the ErrorInfo detail; a NOT_LEADER
// without a detail (an older server, a Session answer) is recognised by its
// reason code, with no hint; other answers are not NOT_LEADER, even an
// ErrorInfo of another reason or a NOT_LEADER text under another code.
func TestLeaderHint(t *testing.T) {
	other, _ := status.New(codes.Unavailable, "dlockd: shutting down (SHUTTING_DOWN)").WithDetails(&errdetails.ErrorInfo{
		Reason: "SHUTTING_DOWN", Metadata: map[string]string{"leader_api": "10.0.0.1:7450"},
	})
	cases := []struct {
		name     string
		err      error
		hint     string
		isLeader bool
	}{
		{"detail with hint", notLeaderErr(t, "10.0.0.2:7450"), "10.0.0.2:7450", true},
		{"detail, leader unknown", notLeaderErr(t, ""), "", true},
		{"detail, spaces trimmed", notLeaderErr(t, " 10.0.0.2:7450 "), "10.0.0.2:7450", true},
		{"reason code only", notLeaderErr(t, "-"), "", true},
		{"another reason's detail", other.Err(), "", false},
		{"NOT_LEADER text under another code", status.Error(codes.FailedPrecondition, "dlockd: x (NOT_LEADER)"), "", false},
		{"connection failure", status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused\""), "", false},
		{"not a status", errors.New("boom"), "", false},
		{"nil", nil, "", false},
	}
	for _, c := range cases {
		hint, ok := leaderHint(c.err)
		if hint != c.hint || ok != c.isLeader {
			t.Errorf("%s: leaderHint = %q, %v; want %q, %v", c.name, hint, ok, c.hint, c.isLeader)
		}
	}
}

// TestClassify: how an attempt's failure steers the next attempt.
func TestClassify(t *testing.T) {
	cases := []struct {
		name         string
		err          error
		attemptEnded bool
		want         failure
		hint         string
	}{
		{"NOT_LEADER with hint", notLeaderErr(t, "h2:2"), false, notLeader, "h2:2"},
		{"NOT_LEADER no hint", notLeaderErr(t, "-"), false, notLeader, ""},
		{"connection refused", status.Error(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused\""), false, unreachable, ""},
		{"shutting down", status.Error(codes.Unavailable, "dlockd: shutting down (SHUTTING_DOWN)"), false, unreachable, ""},
		{"attempt deadline", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), true, unreachable, ""},
		{"caller's deadline", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), false, answered, ""},
		{"lock held", status.Error(codes.FailedPrecondition, "dlockd: acquire \"k\": lock held (LOCK_HELD)"), false, answered, ""},
		{"lease lost", status.Error(codes.NotFound, "dlockd: release \"k\": not the holder (LEASE_LOST)"), false, answered, ""},
		{"capacity", status.Error(codes.ResourceExhausted, "dlockd: too many (TOO_MANY_WAITERS)"), false, answered, ""},
		{"a key that quotes a reason", status.Error(codes.FailedPrecondition, "dlockd: acquire \"x (NOT_LEADER)\": lock held (LOCK_HELD)"), false, answered, ""},
	}
	for _, c := range cases {
		got, hint := classify(c.err, c.attemptEnded)
		if got != c.want || hint != c.hint {
			t.Errorf("%s: classify = %v, %q; want %v, %q", c.name, got, hint, c.want, c.hint)
		}
	}
}

// TestParseMembers: the member list is checked strictly.
func TestParseMembers(t *testing.T) {
	good := map[string][]string{
		"127.0.0.1:7450":                        {"127.0.0.1:7450"},
		"h1:1,h2:2,h3:3":                        {"h1:1", "h2:2", "h3:3"},
		"h1:1, h2:2":                            {"h1:1", "h2:2"},
		"[::1]:7450,127.0.0.1:7450":             {"[::1]:7450", "127.0.0.1:7450"},
		"node-a.example:7450,node-b.example:99": {"node-a.example:7450", "node-b.example:99"},
	}
	for in, want := range good {
		got, err := parseMembers(in, "X")
		if err != nil || strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("parseMembers(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", ",", "h1:1,", ",h1:1", "h1:1,,h2:2", "h1:1,h1:1", "h1:1, h1:1", "h1:1,h2", "h1:1,:2", "h1:1,h2:", "h1:1,h2:0", "h1:1,h2:65536", "h1:1,h2:x"} {
		if got, err := parseMembers(in, "X"); err == nil || !errors.Is(err, driver.ErrInvalidArgument) {
			t.Errorf("parseMembers(%q) = %q, %v; want ErrInvalidArgument", in, got, err)
		}
	}
}

// TestClusterFollow: a hint moves the belief, adds an address not in the
// URL as a member (bounded), and is refused when not host:port or when the
// Driver was built on a caller's connection.
func TestClusterFollow(t *testing.T) {
	d, err := Dial("127.0.0.1:1,127.0.0.1:2", &Options{NoWatch: true, NoSession: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Leader() != "127.0.0.1:1" {
		t.Fatalf("first belief %q; want the URL's first member", d.Leader())
	}
	changedBefore := func() <-chan struct{} { _, ch := d.cl.current(); return ch }()
	if m := d.cl.follow("127.0.0.1:2"); m == nil || d.Leader() != "127.0.0.1:2" {
		t.Fatalf("follow a member: %v, leader %q", m, d.Leader())
	}
	select {
	case <-changedBefore:
	default:
		t.Error("the change channel did not close when the belief moved")
	}
	if m := d.cl.follow("127.0.0.1:3"); m == nil || d.Leader() != "127.0.0.1:3" {
		t.Fatalf("follow a new address: %v, leader %q", m, d.Leader())
	}
	if got := strings.Join(d.Members(), ","); got != "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3" {
		t.Errorf("members %q", got)
	}
	for _, bad := range []string{"nohost", ":7450", "h:0", "a:1,b:2", "127.0.0.1:"} {
		if m := d.cl.follow(bad); m != nil {
			t.Errorf("follow(%q) accepted", bad)
		}
	}
	for i := range maxExtraMembers + 4 {
		d.cl.follow(fmt.Sprintf("127.0.0.2:%d", 1000+i))
	}
	if n := len(d.Members()); n != 2+maxExtraMembers {
		t.Errorf("%d members after many hints; want at most %d", n, 2+maxExtraMembers)
	}
	d.cl.setLeader(d.cl.members[0])
	d.cl.demote(d.cl.members[0])
	if d.Leader() != "127.0.0.1:2" {
		t.Errorf("after demote, leader %q; want the next member", d.Leader())
	}
	d.cl.demote(d.cl.members[0]) // not the leader: nothing moves
	if d.Leader() != "127.0.0.1:2" {
		t.Errorf("a stale demote moved the belief to %q", d.Leader())
	}

	if _, err := d.cl.client(d.cl.members[1]); err != nil {
		t.Fatal(err)
	}
	n := New(d.cl.members[1].cc, &Options{NoWatch: true, NoSession: true})
	defer n.Close()
	if m := n.cl.follow("127.0.0.1:2"); m != nil {
		t.Error("a Driver on a caller's connection followed a hint")
	}
}

// TestCallFollowsHints: call follows a hint at once, pauses after "no
// leader", fails over after a connection failure, stops at the caller's
// deadline with the last error, and makes one attempt when told to (once).
func TestCallFollowsHints(t *testing.T) {
	d, err := Dial("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", &Options{NoWatch: true, NoSession: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var seen []string
	answers := map[string]func() error{
		"127.0.0.1:1": func() error { return notLeaderErr(t, "127.0.0.1:4") }, // a member not in the URL
		"127.0.0.1:4": func() error { return nil },
	}
	who := func(c dlockv1.LockClient) string {
		for _, m := range d.cl.members {
			if m.client == c {
				return m.addr
			}
		}
		return "?"
	}
	fn := func(ctx context.Context, c dlockv1.LockClient) error {
		a := who(c)
		seen = append(seen, a)
		if f := answers[a]; f != nil {
			return f()
		}
		return status.Error(codes.Unavailable, "connection refused")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2e9)
	defer cancel()
	res, err := d.call(ctx, callOpts{}, fn)
	if err != nil || res.m.addr != "127.0.0.1:4" || !res.retried || strings.Join(seen, " ") != "127.0.0.1:1 127.0.0.1:4" {
		t.Fatalf("call = %+v, %v after %q; want success on the hinted member", res, err, seen)
	}
	if d.Leader() != "127.0.0.1:4" {
		t.Errorf("belief %q after following the hint", d.Leader())
	}

	// No leader anywhere: tries every member, pausing, until the deadline;
	// returns the last error.
	d.cl.setLeader(d.cl.members[0])
	seen = nil
	answers = map[string]func() error{
		"127.0.0.1:1": func() error { return notLeaderErr(t, "") },
		"127.0.0.1:2": func() error { return notLeaderErr(t, "127.0.0.1:2") }, // self-hint
	}
	ctx2, cancel2 := context.WithTimeout(t.Context(), 300e6)
	defer cancel2()
	_, err = d.call(ctx2, callOpts{}, fn)
	if _, ok := leaderHint(err); !ok && status.Code(err) != codes.Unavailable {
		t.Errorf("election: err %v", err)
	}
	if len(seen) < 3 || len(seen) > 60 {
		t.Errorf("election: %d attempts (%q); want a few, paced by pauses", len(seen), seen)
	}
	for _, a := range []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"} {
		if !strings.Contains(strings.Join(seen, " "), a) {
			t.Errorf("election: member %s never tried (%q)", a, seen)
		}
	}

	// once: one attempt, but the hint still moves the belief.
	d.cl.setLeader(d.cl.members[0])
	seen = nil
	answers = map[string]func() error{"127.0.0.1:1": func() error { return notLeaderErr(t, "127.0.0.1:2") }}
	_, err = d.call(t.Context(), callOpts{once: true}, fn)
	if err == nil || len(seen) != 1 || d.Leader() != "127.0.0.1:2" {
		t.Errorf("once: err %v, attempts %q, leader %q; want one attempt and the belief moved", err, seen, d.Leader())
	}
}

// releaseClient is a LockClient whose Release answers from a script, one
// answer per call, recording the member each call went to.
type releaseClient struct {
	dlockv1.LockClient // nil: any other method panics
	name               string
	script             *[]error
	calls              *[]string
}

func (c releaseClient) Release(ctx context.Context, in *dlockv1.ReleaseRequest, _ ...grpc.CallOption) (*dlockv1.ReleaseResponse, error) {
	*c.calls = append(*c.calls, c.name)
	err := (*c.script)[0]
	*c.script = (*c.script)[1:]
	return &dlockv1.ReleaseResponse{}, err
}

// TestRelease_AfterAmbiguousAttempt: a release whose first attempt failed
// in a way that may have released (a broken connection) and whose retry
// answers LEASE_LOST is reported as released; a LEASE_LOST at the first
// attempt is ErrLeaseLost; after an ambiguous attempt, a loss the Watch
// stream reported makes it ErrLeaseLost with the reason.
func TestRelease_AfterAmbiguousAttempt(t *testing.T) {
	broken := status.Error(codes.Unavailable, "connection error: desc = \"transport: connection reset by peer\"")
	lost := status.Error(codes.NotFound, "dlockd: release \"k\": not the holder (LEASE_LOST)")
	cases := []struct {
		name   string
		script []error
		reason string // the Watch stream's loss reason, if any
		want   error  // nil: released
	}{
		{"retry answers LEASE_LOST", []error{broken, lost}, "", nil},
		{"first attempt LEASE_LOST", []error{lost}, "", driver.ErrLeaseLost},
		{"retry LEASE_LOST, loss pushed", []error{broken, lost}, "FORCE_RELEASED", driver.ErrLeaseLost},
		{"stale leader then success", []error{notLeaderErr(t, "127.0.0.1:2"), nil}, "", nil},
	}
	for _, c := range cases {
		d, err := Dial("127.0.0.1:1,127.0.0.1:2", &Options{NoWatch: true, NoSession: true})
		if err != nil {
			t.Fatal(err)
		}
		script := append([]error(nil), c.script...)
		var calls []string
		d.cl.mu.Lock()
		for _, m := range d.cl.members {
			m.client = releaseClient{name: m.addr, script: &script, calls: &calls}
		}
		d.cl.mu.Unlock()
		if c.reason != "" {
			d.markLost("k", "owner-0001", 0, c.reason)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2e9)
		err = d.Release(ctx, "k", "owner-0001")
		cancel()
		switch {
		case c.want == nil && err != nil, c.want != nil && !errors.Is(err, c.want):
			t.Errorf("%s: Release = %v (calls %q); want %v", c.name, err, calls, c.want)
		case c.reason != "" && !strings.Contains(fmt.Sprint(err), "force-released"):
			t.Errorf("%s: %v does not give the pushed reason", c.name, err)
		case len(script) != 0:
			t.Errorf("%s: %d scripted answers left (calls %q)", c.name, len(script), calls)
		}
		_ = d.Close()
	}
}
