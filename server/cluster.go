package server

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// Membership.
//
// The Raft configuration (hashicorp/raft) says who the voters are and
// their Raft addresses. The members registry, in the FSM, adds what Raft
// does not know: each member's API address (so that any node can tell a
// client where the leader's API is) and its incarnation, a random ID a
// node draws on its first start and keeps in its stable store: it names a
// data directory, not a node ID.
//
// A node whose data directory was wiped must not come back under its old
// ID as if it held its old log: it may have acknowledged entries (counted
// in a quorum) and voted in a term, and it would come back with neither,
// so one committed entry could be lost or two leaders elected in one term.
// hashicorp/raft cannot tell: a follower with an empty log simply receives
// a snapshot. So dlockd refuses it before Raft can reach it:
//
//   - A node started with Join on an empty data directory keeps its Raft
//     port shut (connections are closed at once) and first asks the leader
//     (AddVoter with check_only) whether it may join. The leader refuses
//     (FAILED_PRECONDITION, MEMBER_CONFLICT) an ID that is in the
//     configuration unless the registry holds the same incarnation (the
//     same node retrying after a lost answer), and an ID or Raft address in
//     the configuration under another Raft address or ID. Only when allowed
//     does the node open its Raft port and ask for the real AddVoter.
//   - Every member registers its API address and incarnation with the
//     leader. A member whose incarnation differs from the registered one
//     (its data directory was replaced) is refused; it logs the error and
//     cuts itself off from Raft (its open Raft connections are closed, new
//     ones refused, and it dials no one), so that it applies nothing more
//     and votes in no election.
//
// The operator's way back is to remove the old member (RemoveServer) and
// join the node again. The second check comes after the node already took
// part in Raft (it was started with InitialCluster on an empty data
// directory, which looks exactly like a first start): --initial-cluster is
// for the first start of a new cluster only.

// ReasonMemberConflict is the reason of an AddVoter refused because the ID
// or Raft address belongs to a member with another address or other data.
const ReasonMemberConflict = "MEMBER_CONFLICT"

// ReasonNotMember is the reason of a member registration refused because
// the node is not in the Raft configuration (it was removed).
const ReasonNotMember = "NOT_MEMBER"

// ReasonTransferFailed is the reason of a leadership transfer that was
// refused (no other voter, a target behind the log) or did not complete.
const ReasonTransferFailed = "TRANSFER_FAILED"

// registerKey is the gRPC metadata key that marks an AddVoter call as a
// member's registration (see addVoter).
const registerKey = "dlock-register"

// registration reports whether ctx is a member's registration.
func registration(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(registerKey)) > 0
}

// incarnationKey is the stable store key of this data directory's
// incarnation.
var incarnationKey = []byte("dlockd_incarnation")

// member is one entry of the members registry.
type member struct {
	api         string // API address, host:port
	incarnation string // the data directory's random ID (empty: added by an operator, not yet registered)
}

// MemberInfo is one member of the cluster as this node knows it.
type MemberInfo struct {
	// ID is the member's node ID.
	ID string
	// APIAddr is the member's API address (host:port); empty until the
	// member has registered it.
	APIAddr string
	// RaftAddr is the member's Raft address.
	RaftAddr string
	// Voter is true for a voter, false for a non-voter.
	Voter bool
	// Leader is true for the leader as this node knows it.
	Leader bool
	// AppliedIndex is the last log index the member applied, when known
	// (this node's own; 0: unknown).
	AppliedIndex uint64
	// LastContact is how long ago the member last heard from the leader
	// (0 for the leader), when known; -1: unknown.
	LastContact time.Duration
	// State is the member's Raft state when known (this node's own), else
	// "".
	State string
	// Term is the member's current term when known, else 0.
	Term uint64
}

// applyMember applies opSetMember or opRemoveMember with f.mu held.
func (f *fsm) applyMember(c *command) {
	switch c.op {
	case opSetMember:
		f.members[c.key] = member{api: c.holder, incarnation: c.session}
	case opRemoveMember:
		delete(f.members, c.key)
	}
}

// member returns the registry entry of id.
func (f *fsm) member(id string) (member, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	m, ok := f.members[id]
	return m, ok
}

// copyMembers returns a copy of the registry; f.mu is held (read).
func (f *fsm) copyMembers() map[string]member {
	out := make(map[string]member, len(f.members))
	for k, v := range f.members {
		out[k] = v
	}
	return out
}

// The members registry is the last section of a snapshot: its encoding,
// then its length (4 bytes, big-endian), then membersTrailer. A snapshot
// that does not end with the trailer (written by an earlier version) has
// an empty registry, and an earlier version reading a newer snapshot stops
// before the section (its decoder ignores trailing bytes), so snapshots
// stay readable both ways and the lock table's format is untouched. The
// lock table ends with a number, never with this text.
const membersTrailer = "\x00dlockd-members-v1"

// appendMembersSection appends the registry section to b.
func appendMembersSection(b []byte, members map[string]member) []byte {
	ids := make([]string, 0, len(members))
	for id := range members {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	e := enc{b: make([]byte, 0, 64*len(ids)+8)}
	e.u64(uint64(len(ids)))
	for _, id := range ids {
		e.str(id)
		e.str(members[id].api)
		e.str(members[id].incarnation)
	}
	b = append(b, e.b...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(e.b)))
	return append(b, membersTrailer...)
}

// splitMembersSection returns the lock table part of a snapshot and its
// members registry (empty for a snapshot without one).
func splitMembersSection(data []byte) ([]byte, map[string]member, error) {
	members := make(map[string]member)
	n := len(data)
	t := len(membersTrailer)
	if n < t+4 || string(data[n-t:]) != membersTrailer {
		return data, members, nil
	}
	size := int(binary.BigEndian.Uint32(data[n-t-4 : n-t]))
	if size > n-t-4 {
		return nil, nil, errCorrupt
	}
	start := n - t - 4 - size
	d := dec{b: data[start : n-t-4]}
	count := d.u64()
	if count > uint64(len(d.b)) {
		return nil, nil, errCorrupt
	}
	for i := uint64(0); i < count && d.err == nil; i++ {
		id := d.str()
		members[id] = member{api: d.str(), incarnation: d.str()}
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, nil, errCorrupt
	}
	return data[:start], members, nil
}

// apiAdvertise returns this node's API address as other nodes and clients
// reach it: Config.Advertise, else the address the API listens on.
func (s *Server) apiAdvertise() string {
	if s.cfg.Advertise != "" {
		return s.cfg.Advertise
	}
	// Not Addr: Start holds Server.mu while the API already serves, and
	// a NOT_LEADER answer (which names this node's address) must not wait
	// for Start to return.
	a, _ := s.boundAPI.Load().(string)
	return a
}

// leaderAPI returns the leader's node ID and API address as this node
// knows them; either is "" when unknown (no leader, or a leader that has
// not registered its API address yet).
func (s *Server) leaderAPI() (id, api string) {
	if s.raft == nil {
		return "", ""
	}
	_, lid := s.raft.LeaderWithID()
	if lid == "" {
		return "", ""
	}
	if string(lid) == s.cfg.NodeID {
		return string(lid), s.apiAdvertise()
	}
	m, _ := s.fsm.member(string(lid))
	return string(lid), m.api
}

// raftConfiguration returns the latest Raft configuration.
func (s *Server) raftConfiguration() (raft.Configuration, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return raft.Configuration{}, err
	}
	return f.Configuration(), nil
}

// Members returns the members of the Raft configuration as this node knows
// them, ordered by ID, with their registered API addresses. Only this
// node's own entry carries its applied index, last contact, state and term
// (see the Cluster Status call for every member's). Nil before Start.
func (s *Server) Members() []MemberInfo {
	if s.raft == nil {
		return nil
	}
	conf, err := s.raftConfiguration()
	if err != nil {
		return nil
	}
	_, lid := s.raft.LeaderWithID()
	out := make([]MemberInfo, 0, len(conf.Servers))
	for _, srv := range conf.Servers {
		mi := MemberInfo{ID: string(srv.ID), RaftAddr: string(srv.Address), Voter: srv.Suffrage == raft.Voter, Leader: srv.ID == lid, LastContact: -1}
		if m, ok := s.fsm.member(mi.ID); ok {
			mi.APIAddr = m.api
		}
		if mi.ID == s.cfg.NodeID {
			self := s.selfInfo()
			mi.APIAddr, mi.AppliedIndex, mi.LastContact, mi.State, mi.Term = self.APIAddr, self.AppliedIndex, self.LastContact, self.State, self.Term
		}
		out = append(out, mi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// selfInfo returns this node's own entry.
func (s *Server) selfInfo() MemberInfo {
	st := s.raft.State()
	mi := MemberInfo{
		ID: s.cfg.NodeID, APIAddr: s.apiAdvertise(), RaftAddr: string(s.transport.LocalAddr()),
		AppliedIndex: s.raft.AppliedIndex(), State: st.String(), Term: s.raft.CurrentTerm(), LastContact: -1,
	}
	if st == raft.Leader {
		mi.LastContact = 0
	} else if lc := s.raft.LastContact(); !lc.IsZero() {
		mi.LastContact = time.Since(lc)
	}
	if conf, err := s.raftConfiguration(); err == nil {
		for _, srv := range conf.Servers {
			if string(srv.ID) == s.cfg.NodeID {
				mi.Voter = srv.Suffrage == raft.Voter
			}
		}
	}
	_, lid := s.raft.LeaderWithID()
	mi.Leader = string(lid) == s.cfg.NodeID
	return mi
}

// peers keeps one gRPC client connection per member API address, for
// forwarded cluster calls, registrations and status probes.
type peers struct {
	mu      sync.Mutex
	conns   map[string]*grpc.ClientConn
	rewrite map[string]string                // Config.RaftDialRewrite: tests' proxies on node-to-node links
	creds   credentials.TransportCredentials // Server.memberGRPCCreds (tls.go); nil: insecure
}

// client returns the Cluster client of addr.
func (p *peers) client(addr string) (dlockv1.ClusterClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.conns[addr]; c != nil {
		return dlockv1.NewClusterClient(c), nil
	}
	target := addr
	if to, ok := p.rewrite[addr]; ok {
		target = to
	}
	creds := p.creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	// TLS verifies the member as addr, even through a dial rewrite.
	c, err := grpc.NewClient("passthrough:///"+target, grpc.WithTransportCredentials(creds), grpc.WithAuthority(addr))
	if err != nil {
		return nil, err
	}
	if p.conns == nil {
		p.conns = make(map[string]*grpc.ClientConn)
	}
	p.conns[addr] = c
	return dlockv1.NewClusterClient(c), nil
}

// close closes every connection.
func (p *peers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// forwardCtx marks ctx as forwarded (mdForwarded, forward.go): the
// receiver never forwards the call again.
func forwardCtx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, mdForwarded, "1")
}

// onLeader runs call on the leader's Cluster service, marked as forwarded,
// and returns the leader's answer as this node's own (passThrough); or
// leaderClient's NOT_LEADER error.
func onLeader[Resp any](s *Server, ctx context.Context, call func(dlockv1.ClusterClient, context.Context) (Resp, error)) (Resp, error) {
	c, err := s.leaderClient(ctx)
	if err != nil {
		var none Resp
		return none, err
	}
	resp, err := call(c, onBehalfOf(forwardCtx(ctx))) // names the caller's identity (auth.go)
	return resp, s.passThrough(err)
}

// clusterAPI implements dlockv1.ClusterServer.
type clusterAPI struct {
	dlockv1.UnimplementedClusterServer
	s *Server
}

// leaderClient returns the leader's Cluster client for forwarding a call
// that must run on the leader, or an error: NOT_LEADER when the call was
// forwarded already or the leader's API address is unknown.
func (s *Server) leaderClient(ctx context.Context) (dlockv1.ClusterClient, error) {
	id, api := s.leaderAPI()
	if forwardedGRPC(ctx) || api == "" || id == s.cfg.NodeID {
		return nil, s.notLeader("not the leader")
	}
	return s.peers.client(api)
}

// passThrough returns the answer of a Cluster call forwarded to the leader
// as this node's own: the leader's gRPC code, message and leader hint
// (errdetails.ErrorInfo) unchanged, as an *apiError so that the JSON routes
// answer the same code (UNAVAILABLE is 503, not 500) and fields. A failure
// to reach the leader (no dlockd answer: a transport error) is UNAVAILABLE
// (NOT_LEADER) with this node's hint, so that clients retry.
func (s *Server) passThrough(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return s.notLeader("forwarding to the leader: %v", err)
	}
	msg, reason := st.Message(), ""
	if r, ok := statusReason(err); ok && strings.HasPrefix(msg, "dlockd: ") {
		reason = r
		msg = strings.TrimSuffix(strings.TrimPrefix(msg, "dlockd: "), " ("+r+")")
	}
	ae := &apiError{code: st.Code(), reason: reason, msg: msg}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			ae.leader = &leaderHint{id: info.GetMetadata()[MetaLeaderID], api: info.GetMetadata()[MetaLeaderAPI]}
			if ae.reason == "" {
				ae.reason = info.GetReason()
			}
		}
	}
	if ae.reason == "" {
		// Not a dlockd answer: the leader could not be reached.
		if st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded || st.Code() == codes.Canceled {
			return s.notLeader("forwarding to the leader: %s", st.Message())
		}
		ae.reason = ReasonInternal
	}
	return ae
}

// isLeader reports whether this node is the Raft leader.
func (s *Server) isLeader() bool { return s.raft.State() == raft.Leader }

// Status implements the Cluster service.
func (a *clusterAPI) Status(ctx context.Context, req *dlockv1.ClusterStatusRequest) (*dlockv1.ClusterStatusResponse, error) {
	if err := a.s.authorizeRequest(ctx, req); err != nil { // read on "" (auth.go)
		return nil, err
	}
	return a.s.clusterStatus(ctx, req.GetLocal())
}

// clusterStatus answers Status: this node's view of the members; unless
// local, each other member's own state is asked for (in parallel, bounded
// by 1s).
func (s *Server) clusterStatus(ctx context.Context, local bool) (*dlockv1.ClusterStatusResponse, error) {
	if s.removed.Load() {
		// Its Raft state is stale (it hears from no leader): only its own
		// entry, saying so; the members are another member's to tell.
		if !local {
			return nil, s.removedErr()
		}
		self := s.selfInfo()
		self.State, self.Voter, self.Leader = "Removed", false, false
		return &dlockv1.ClusterStatusResponse{Term: s.raft.CurrentTerm(), NodeId: s.cfg.NodeID, Members: []*dlockv1.MemberStatus{memberPB(self)}}, nil
	}
	lid, lapi := s.leaderAPI()
	resp := &dlockv1.ClusterStatusResponse{LeaderId: lid, LeaderApi: lapi, Term: s.raft.CurrentTerm(), NodeId: s.cfg.NodeID}
	resp.Batching = s.isLeader() && s.batchEntries()
	if local {
		self := memberPB(s.selfInfo())
		self.BatchEntries = s.decodesBatches()
		resp.Members = []*dlockv1.MemberStatus{self}
		return resp, nil
	}
	ms := s.Members()
	resp.Members = make([]*dlockv1.MemberStatus, len(ms))
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, m := range ms {
		resp.Members[i] = memberPB(m)
		if m.ID == s.cfg.NodeID {
			resp.Members[i].BatchEntries = s.decodesBatches()
			continue
		}
		if m.APIAddr == "" {
			resp.Members[i].Error = "API address not registered yet"
			continue
		}
		wg.Add(1)
		go func(pb *dlockv1.MemberStatus, addr string) {
			defer wg.Done()
			c, err := s.peers.client(addr)
			if err == nil {
				var r *dlockv1.ClusterStatusResponse
				if r, err = c.Status(forwardCtx(ctx), &dlockv1.ClusterStatusRequest{Local: true}); err == nil && len(r.GetMembers()) == 1 {
					own := r.GetMembers()[0]
					pb.AppliedIndex, pb.LastContact, pb.State, pb.Term = own.GetAppliedIndex(), own.GetLastContact(), own.GetState(), own.GetTerm()
					pb.BatchEntries = own.GetBatchEntries()
					return
				}
			}
			if err != nil {
				pb.Error = err.Error()
			}
		}(resp.Members[i], m.APIAddr)
	}
	wg.Wait()
	return resp, nil
}

func memberPB(m MemberInfo) *dlockv1.MemberStatus {
	pb := &dlockv1.MemberStatus{Id: m.ID, ApiAddr: m.APIAddr, RaftAddr: m.RaftAddr, Voter: m.Voter, Leader: m.Leader, AppliedIndex: m.AppliedIndex, State: m.State, Term: m.Term}
	if m.LastContact >= 0 {
		pb.LastContact = durationpb.New(m.LastContact)
	}
	return pb
}

// AddVoter implements the Cluster service (see the proto and the
// Membership comment above).
func (a *clusterAPI) AddVoter(ctx context.Context, req *dlockv1.AddVoterRequest) (*dlockv1.AddVoterResponse, error) {
	s := a.s
	if err := s.authorizeRequest(ctx, req); err != nil { // admin on "" (auth.go)
		return nil, err
	}
	if s.removed.Load() {
		return nil, s.removedErr()
	}
	if registration(ctx) {
		// A member's registration names an ID already in the configuration.
		if req.GetId() == "" || len(req.GetId()) > 256 {
			return nil, apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid member id %q: want 1 to 256 bytes", req.GetId())
		}
	} else if err := CheckNodeID(req.GetId()); err != nil {
		return nil, apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid member id: %v", err)
	}
	if err := checkDialAddr(req.GetRaftAddr()); err != nil {
		return nil, apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid raft_addr %q: %v", req.GetRaftAddr(), err)
	}
	if req.GetApiAddr() != "" {
		if err := checkDialAddr(req.GetApiAddr()); err != nil {
			return nil, apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid api_addr %q: %v", req.GetApiAddr(), err)
		}
	}
	if len(req.GetIncarnation()) > 128 {
		return nil, apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid incarnation: %d bytes > 128", len(req.GetIncarnation()))
	}
	if !s.isLeader() {
		reg := registration(ctx)
		return onLeader(s, ctx, func(c dlockv1.ClusterClient, fctx context.Context) (*dlockv1.AddVoterResponse, error) {
			if reg {
				fctx = metadata.AppendToOutgoingContext(fctx, registerKey, "1")
			}
			return c.AddVoter(fctx, req)
		})
	}
	resp, err := s.addVoter(req, registration(ctx))
	if !registration(ctx) && !req.GetCheckOnly() { // an addition, not a member's own bookkeeping
		s.audit(ctx, "cluster-add", "", fmt.Sprintf("add %s (raft %s, api %s)", req.GetId(), req.GetRaftAddr(), req.GetApiAddr()), err)
	}
	return resp, err
}

// addVoter runs AddVoter on the leader, one membership change at a time.
// A registration (register: a member's memberLoop recording its API
// address and incarnation) never adds a voter: it is refused
// (ReasonNotMember) when the ID is not in the configuration, so that a
// removed member stays removed.
func (s *Server) addVoter(req *dlockv1.AddVoterRequest, register bool) (*dlockv1.AddVoterResponse, error) {
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	conf, err := s.raftConfiguration()
	if err != nil {
		return nil, s.raftErr(err)
	}
	id, addr := req.GetId(), req.GetRaftAddr()
	var cur *raft.Server
	for i := range conf.Servers {
		srv := &conf.Servers[i]
		if string(srv.ID) == id {
			cur = srv
		} else if string(srv.Address) == addr {
			return nil, apiErr(codes.FailedPrecondition, ReasonMemberConflict,
				"Raft address %s belongs to member %q: remove it first (dlock cluster remove %s), or give node %q another address", addr, srv.ID, srv.ID, id)
		}
	}
	if register && cur == nil {
		return nil, apiErr(codes.FailedPrecondition, ReasonNotMember,
			"node %q is not a member of the cluster (it was removed): its registration adds nothing; to add it again, empty its data directory and start it with --join", id)
	}
	rec, hasRec := s.fsm.member(id)
	if cur != nil {
		if string(cur.Address) != addr {
			return nil, apiErr(codes.FailedPrecondition, ReasonMemberConflict,
				"node ID %q is already a member at Raft address %s, not %s (%s): if that member is really gone, remove it first (dlock cluster remove %s) and add this node again; otherwise choose another --node-id", id, cur.Address, addr, s.memberContact(id, rec.api), id)
		}
		inc := req.GetIncarnation()
		sameData := inc == "" || rec.incarnation == inc || (!req.GetCheckOnly() && rec.incarnation == "")
		if !sameData {
			return nil, apiErr(codes.FailedPrecondition, ReasonMemberConflict,
				"node ID %q is already a member (at Raft address %s; %s), with another data directory than this node's: this node cannot rejoin as if it held that member's log. If that member is really gone (its data directory lost or wiped), remove it first (dlock cluster remove %s), then join again with an empty data directory; otherwise choose another --node-id", id, cur.Address, s.memberContact(id, rec.api), id)
		}
	}
	want := member{api: req.GetApiAddr(), incarnation: req.GetIncarnation()}
	if want.api == "" {
		want.api = rec.api
	}
	if want.incarnation == "" {
		want.incarnation = rec.incarnation
	}
	if !hasRec || rec != want {
		if _, err := s.propose(&command{op: opSetMember, key: id, holder: want.api, session: want.incarnation}); err != nil {
			return nil, err
		}
	}
	if req.GetCheckOnly() {
		return &dlockv1.AddVoterResponse{AlreadyMember: cur != nil}, nil
	}
	if cur != nil && cur.Suffrage == raft.Voter {
		return &dlockv1.AddVoterResponse{AlreadyMember: true}, nil
	}
	f := s.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, s.cfg.ApplyTimeout)
	if err := f.Error(); err != nil {
		return nil, s.raftErr(err)
	}
	s.log.Info("dlockd: voter added", "id", id, "raft", addr, "api", want.api, "index", f.Index())
	s.pokeMembers() // this leader registers itself once it has company
	return &dlockv1.AddVoterResponse{AlreadyMember: cur != nil, Index: f.Index()}, nil
}

// RemoveServer implements the Cluster service.
func (a *clusterAPI) RemoveServer(ctx context.Context, req *dlockv1.RemoveServerRequest) (resp *dlockv1.RemoveServerResponse, err error) {
	s := a.s
	if err := s.authorizeRequest(ctx, req); err != nil { // admin on "" (auth.go)
		return nil, err
	}
	if s.removed.Load() {
		return nil, s.removedErr()
	}
	if req.GetId() == "" {
		return nil, apiErr(codes.InvalidArgument, ReasonInvalidRequest, "invalid member id: empty")
	}
	if !s.isLeader() {
		return onLeader(s, ctx, func(c dlockv1.ClusterClient, fctx context.Context) (*dlockv1.RemoveServerResponse, error) {
			return c.RemoveServer(fctx, req)
		})
	}
	defer func() { s.audit(ctx, "cluster-remove", "", "remove "+req.GetId(), err) }()
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	conf, err := s.raftConfiguration()
	if err != nil {
		return nil, s.raftErr(err)
	}
	found, voters := false, 0
	for _, srv := range conf.Servers {
		if string(srv.ID) == req.GetId() {
			found = true
		}
		if srv.Suffrage == raft.Voter {
			voters++
		}
	}
	if !found {
		return nil, apiErr(codes.NotFound, ReasonInvalidRequest, "node %q is not a member", req.GetId())
	}
	if voters == 1 && len(conf.Servers) == 1 {
		return nil, apiErr(codes.FailedPrecondition, ReasonMemberConflict, "node %q is the only voter: removing it would leave no cluster", req.GetId())
	}
	f := s.raft.RemoveServer(raft.ServerID(req.GetId()), 0, s.cfg.ApplyTimeout)
	if err := f.Error(); err != nil {
		return nil, s.raftErr(err)
	}
	s.log.Info("dlockd: member removed", "id", req.GetId(), "index", f.Index())
	if req.GetId() != s.cfg.NodeID {
		// The registry entry goes too (a stale one is harmless: a node
		// not in the configuration may join with any incarnation).
		_, _ = s.propose(&command{op: opRemoveMember, key: req.GetId()})
	}
	return &dlockv1.RemoveServerResponse{Index: f.Index()}, nil
}

// TransferLeader implements the Cluster service: it hands leadership to
// the voter req names (or, with no ID, to the voter raft finds most up to
// date) and returns the new leader's ID once this node knows it. It
// answers FAILED_PRECONDITION (TRANSFER_FAILED) when there is no other
// voter, or when the target is known to be behind the log (its own status
// says its applied index lags, or it has not heard from this leader for a
// heartbeat timeout); UNAVAILABLE (TRANSFER_FAILED) when the transfer did
// not complete and this node is still the leader; UNAVAILABLE
// (NOT_LEADER, with the new leader as hint) when leadership moved but the
// new leader is not known yet.
func (a *clusterAPI) TransferLeader(ctx context.Context, req *dlockv1.TransferLeaderRequest) (resp *dlockv1.TransferLeaderResponse, err error) {
	s := a.s
	if err := s.authorizeRequest(ctx, req); err != nil { // admin on "" (auth.go)
		return nil, err
	}
	if s.removed.Load() {
		return nil, s.removedErr()
	}
	if !s.isLeader() {
		return onLeader(s, ctx, func(c dlockv1.ClusterClient, fctx context.Context) (*dlockv1.TransferLeaderResponse, error) {
			return c.TransferLeader(fctx, req)
		})
	}
	defer func() {
		s.audit(ctx, "cluster-transfer-leader", "", "transfer to "+cmp.Or(req.GetId(), "any voter"), err)
	}()
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	conf, err := s.raftConfiguration()
	if err != nil {
		return nil, s.raftErr(err)
	}
	others := 0
	var target *raft.Server
	for i := range conf.Servers {
		srv := &conf.Servers[i]
		if srv.Suffrage != raft.Voter || string(srv.ID) == s.cfg.NodeID {
			continue
		}
		others++
		if string(srv.ID) == req.GetId() {
			target = srv
		}
	}
	id := req.GetId()
	if id == s.cfg.NodeID {
		return &dlockv1.TransferLeaderResponse{LeaderId: id}, nil
	}
	if others == 0 {
		return nil, apiErr(codes.FailedPrecondition, ReasonTransferFailed, "no other voter to transfer leadership to (this cluster has one voter, %s)", s.cfg.NodeID)
	}
	to := "another voter"
	if id != "" {
		if target == nil {
			return nil, apiErr(codes.NotFound, ReasonInvalidRequest, "node %q is not a voter", id)
		}
		to = id
		if why := s.targetBehind(ctx, id); why != "" {
			return nil, apiErr(codes.FailedPrecondition, ReasonTransferFailed, "transfer to %s refused: the target is behind the log (%s); try again when it has caught up", id, why)
		}
		err = s.transferLeadership(func() raft.Future { return s.raft.LeadershipTransferToServer(target.ID, target.Address) })
	} else {
		err = s.transferLeadership(s.raft.LeadershipTransfer)
	}
	if err != nil {
		return nil, s.transferFailed(to, err.Error())
	}
	// Wait (bounded) until this node knows the new leader.
	deadline := time.Now().Add(s.cfg.ElectionTimeout * 5)
	for {
		_, lid := s.raft.LeaderWithID()
		if lid != "" && string(lid) != s.cfg.NodeID {
			s.log.Info("dlockd: leadership transferred", "to", string(lid))
			return &dlockv1.TransferLeaderResponse{LeaderId: string(lid)}, nil
		}
		if time.Now().After(deadline) {
			return nil, s.transferFailed(to, "no new leader within "+(s.cfg.ElectionTimeout*5).String())
		}
		select {
		case <-ctx.Done():
			return nil, ctxErr(ctx)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// transferFailed returns the answer to a leadership transfer to "to" that
// did not complete: UNAVAILABLE (TRANSFER_FAILED) while this node is still
// the leader, else NOT_LEADER with the hint of whoever leads now.
func (s *Server) transferFailed(to, detail string) error {
	msg := fmt.Sprintf("transfer to %s did not complete (%s): the target may be behind the log; try again when it has caught up", to, detail)
	if s.isLeader() {
		s.log.Warn("dlockd: leadership transfer did not complete; still the leader", "to", to, "detail", detail)
		return apiErr(codes.Unavailable, ReasonTransferFailed, "%s", msg)
	}
	return s.notLeader("%s", msg)
}

// targetBehind asks voter id for its own status (bounded by 1s) and
// returns why it is behind this leader's log, or "" when it is caught up
// or cannot tell (no registered API address, no answer): raft's own
// transfer then catches it up or fails. Behind: it has not heard from this
// leader for a heartbeat timeout, or its applied index lags this leader's
// last index by more than 8 batches (MaxAppendEntries) of entries.
func (s *Server) targetBehind(ctx context.Context, id string) string {
	m, ok := s.fsm.member(id)
	if !ok || m.api == "" {
		return ""
	}
	c, err := s.peers.client(m.api)
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	r, err := c.Status(forwardCtx(ctx), &dlockv1.ClusterStatusRequest{Local: true})
	if err != nil || len(r.GetMembers()) != 1 {
		return ""
	}
	own := r.GetMembers()[0]
	last := s.raft.LastIndex()
	lag := uint64(0)
	if last > own.GetAppliedIndex() {
		lag = last - own.GetAppliedIndex()
	}
	if lc := own.GetLastContact(); lc == nil || lc.AsDuration() > s.cfg.HeartbeatTimeout {
		contact := "never"
		if lc != nil {
			contact = lc.AsDuration().Round(time.Millisecond).String() + " ago"
		}
		return fmt.Sprintf("its last contact with this leader: %s; applied index %d, leader's last index %d", contact, own.GetAppliedIndex(), last)
	}
	if lag > 8*uint64(s.cfg.MaxAppendEntries) {
		return fmt.Sprintf("applied index %d, leader's last index %d", own.GetAppliedIndex(), last)
	}
	return ""
}

// memberContact describes how member id is doing, for a refusal that
// names it: its last contact with the leader as its own status says
// (asked at api, bounded by 500ms), or that it does not answer.
func (s *Server) memberContact(id, api string) string {
	if id == s.cfg.NodeID {
		return "it is this leader"
	}
	if api == "" {
		return "its API address is not registered"
	}
	c, err := s.peers.client(api)
	if err != nil {
		return "its API at " + api + " cannot be dialed"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	r, err := c.Status(forwardCtx(ctx), &dlockv1.ClusterStatusRequest{Local: true})
	if err != nil || len(r.GetMembers()) != 1 {
		return "its API at " + api + " does not answer"
	}
	if lc := r.GetMembers()[0].GetLastContact(); lc != nil {
		return fmt.Sprintf("it answers at %s, last contact with the leader %s ago", api, lc.AsDuration().Round(time.Millisecond))
	}
	return "it answers at " + api + ", last contact with the leader unknown"
}

// loadIncarnation reads this data directory's incarnation from the stable
// store, drawing and storing one when there is none.
func (s *Server) loadIncarnation() error {
	v, err := s.store.Get(incarnationKey)
	if err == nil && len(v) > 0 {
		s.incarnation = string(v)
		return nil
	}
	inc := newToken()
	if err := s.store.Set(incarnationKey, []byte(inc)); err != nil {
		return fmt.Errorf("dlockd: store incarnation: %w", err)
	}
	s.incarnation = inc
	return nil
}

// inConfiguration reports whether this node is in the Raft configuration.
func (s *Server) inConfiguration() bool {
	conf, err := s.raftConfiguration()
	if err != nil {
		return false
	}
	for _, srv := range conf.Servers {
		if string(srv.ID) == s.cfg.NodeID {
			return true
		}
	}
	return false
}

// joinLoop asks the member at Config.Join to add this node (started on an
// empty data directory) as a voter: first whether it may (its Raft port
// stays shut until then), then for real; retried with backoff until one
// AddVoter succeeds or the server shuts down. Once the leader has added
// this node, it never asks again (it only waits for the configuration to
// reach it): a node an operator removes afterwards stays removed.
func (s *Server) joinLoop() {
	defer s.loops.Done()
	backoff := 100 * time.Millisecond
	allowed := false
	for !s.inConfiguration() {
		err := s.askJoin(&allowed)
		if err == nil {
			break
		}
		s.log.Warn("dlockd: join not done yet, retrying", "join", s.cfg.Join, "err", err, "in", backoff)
		select {
		case <-s.stopCh:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	// The leader committed the configuration; it reaches this node with
	// the next AppendEntries.
	asked := time.Now()
	for !s.inConfiguration() {
		select {
		case <-s.stopCh:
			return
		case <-time.After(20 * time.Millisecond):
		}
		// Removed again before the configuration reached this node, the
		// leader sends it nothing more: ask the members now and then.
		if time.Since(asked) > 3*s.cfg.ElectionTimeout {
			asked = time.Now()
			if err := s.askMembership(); err != nil {
				s.leaveCluster(err.Error())
				return
			}
		}
	}
	s.hasState.Store(true)
	s.stream.setOpen(true)
	s.log.Info("dlockd: joined the cluster", "node", s.cfg.NodeID, "via", s.cfg.Join)
	s.pokeMembers()
}

// askJoin makes one round of the join: the check (once allowed, not
// again), then AddVoter.
func (s *Server) askJoin(allowed *bool) error {
	c, err := s.peers.client(s.cfg.Join)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ApplyTimeout+2*time.Second)
	defer cancel()
	go func() {
		select {
		case <-s.stopCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	req := &dlockv1.AddVoterRequest{Id: s.cfg.NodeID, RaftAddr: string(s.transport.LocalAddr()), ApiAddr: s.apiAdvertise(), Incarnation: s.incarnation}
	if !*allowed {
		req.CheckOnly = true
		if _, err := c.AddVoter(ctx, req); err != nil {
			return err
		}
		*allowed = true
		s.stream.setOpen(true)
		req.CheckOnly = false
	}
	_, err = c.AddVoter(ctx, req)
	return err
}

// pokeMembers wakes memberLoop (never blocks).
func (s *Server) pokeMembers() {
	select {
	case s.memberWake <- struct{}{}:
	default:
	}
}

// memberLoop keeps this node's registry entry (API address, incarnation)
// current: the leader proposes it itself, a follower asks the leader
// (AddVoter with its own address, which records it). Checked when poked
// (a leadership change) and every second.
//
// It also notices that this node was removed from the cluster: its own
// committed configuration no longer names it after it did, or the leader
// refuses its registration as not a member (ReasonNotMember). The node
// then logs it and takes no further part (its Raft port is shut both
// ways); to add it again, wipe its data directory and start it with Join.
func (s *Server) memberLoop() {
	defer s.loops.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	wasMember := false
	for {
		select {
		case <-s.stopCh:
			return
		case <-s.memberWake:
		case <-t.C:
		}
		in, committed := s.membership()
		if in {
			wasMember = true
		} else if wasMember && committed {
			s.leaveCluster("its committed Raft configuration no longer names it")
			return
		}
		if (in || wasMember) && s.leaderless() {
			// No leader heard from for a while: perhaps removed without
			// hearing of it, or having heard of it (its latest
			// configuration leaves it out) without learning that the
			// change committed: the leader no longer sends it anything.
			// Ask the members whether it still is one.
			if err := s.askMembership(); err != nil {
				s.leaveCluster(err.Error())
				return
			}
		}
		s.startBatchProbe()
		if err := s.registerSelf(); err != nil {
			var ae *apiError
			if errors.As(err, &ae) && ae.reason == ReasonMemberConflict {
				s.log.Error("dlockd: this node's membership is refused; its Raft port is shut", "err", err)
				s.stream.setOpen(false)
				return
			}
			if errors.As(err, &ae) && ae.reason == ReasonNotMember {
				s.leaveCluster("the leader refused its registration: " + ae.msg)
				return
			}
			s.log.Debug("dlockd: member registration not done yet", "err", err)
		}
	}
}

// membership reports whether this node is in its latest Raft configuration,
// and whether that configuration is committed (this node applied its
// index).
func (s *Server) membership() (in, committed bool) {
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return false, false
	}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == s.cfg.NodeID {
			in = true
		}
	}
	return in, s.raft.AppliedIndex() >= f.Index()
}

// leaderless reports whether this follower has heard from no leader for
// 3 election timeouts.
func (s *Server) leaderless() bool {
	if s.isLeader() {
		return false
	}
	lc := s.raft.LastContact()
	return lc.IsZero() || time.Since(lc) > 3*s.cfg.ElectionTimeout
}

// askMembership sends this node's registration to the members it knows
// (a follower forwards it to the leader) and returns an error when one
// answers that it is not a member (ReasonNotMember), else nil.
func (s *Server) askMembership() error {
	s.fsm.mu.RLock()
	ms := s.fsm.copyMembers()
	s.fsm.mu.RUnlock()
	if s.cfg.Join != "" {
		// A node that joined may not have the members' entries yet: the
		// member it joined through answers too.
		ms["join:"+s.cfg.Join] = member{api: s.cfg.Join}
	}
	for id, m := range ms {
		if id == s.cfg.NodeID || m.api == "" {
			continue
		}
		c, err := s.peers.client(m.api)
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = c.AddVoter(metadata.AppendToOutgoingContext(ctx, registerKey, "1"), &dlockv1.AddVoterRequest{Id: s.cfg.NodeID, RaftAddr: string(s.transport.LocalAddr()), ApiAddr: s.apiAdvertise(), Incarnation: s.incarnation})
		cancel()
		if r, _ := statusReason(err); r == ReasonNotMember {
			return fmt.Errorf("member %s: %v", id, err)
		}
	}
	return nil
}

// leaveCluster cuts this node off from Raft for good after it was removed
// from the cluster, and says so.
func (s *Server) leaveCluster(why string) {
	s.removed.Store(true)
	s.stream.setOpen(false)
	s.log.Warn("dlockd: this node was removed from the cluster and takes no further part (its Raft port is shut); to add it again, stop it, empty its data directory and start it with --join", "node", s.cfg.NodeID, "why", why)
}

// removedErr is the answer of a node that was removed from the cluster
// (see leaveCluster): UNAVAILABLE (NOT_MEMBER), with no leader hint (its
// view of the leader is stale).
func (s *Server) removedErr() error {
	return apiErr(codes.Unavailable, ReasonNotMember, "this node (%s) was removed from the cluster and takes no further part: ask another member; to add it again, stop it, empty its data directory and start it with --join", s.cfg.NodeID)
}

// divergedErr is the answer of a node whose FSM skipped a committed entry
// (see undecodable): UNAVAILABLE (DIVERGED), with no leader hint.
func (s *Server) divergedErr(index uint64) error {
	return apiErr(codes.Unavailable, ReasonDiverged, "this node (%s) could not decode committed log entry %d (written by a newer dlockd?) and no longer serves: ask another member; upgrade this node, empty its data directory and start it with --join", s.cfg.NodeID, index)
}

// registerSelf makes one attempt at registering this node; nil when its
// entry is current (or it is not a member yet).
func (s *Server) registerSelf() error {
	want := member{api: s.apiAdvertise(), incarnation: s.incarnation}
	if rec, ok := s.fsm.member(s.cfg.NodeID); ok && rec == want {
		return nil
	}
	conf, err := s.raftConfiguration()
	if err != nil || !s.inConfiguration() {
		return nil
	}
	if len(conf.Servers) == 1 {
		// A single voter needs no entry (it answers with its own address)
		// and writes nothing it did not before: its first grant's fence
		// is what it always was. It registers once a member joins.
		return nil
	}
	if s.isLeader() {
		if !s.ready.Load() {
			return errors.New("not ready yet")
		}
		_, err := s.propose(&command{op: opSetMember, key: s.cfg.NodeID, holder: want.api, session: want.incarnation})
		return err
	}
	_, api := s.leaderAPI()
	if api == "" {
		return errors.New("leader unknown")
	}
	c, err := s.peers.client(api)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(forwardCtx(ctx), registerKey, "1")
	_, err = c.AddVoter(ctx, &dlockv1.AddVoterRequest{Id: s.cfg.NodeID, RaftAddr: string(s.transport.LocalAddr()), ApiAddr: want.api, Incarnation: want.incarnation})
	if st, ok := statusReason(err); ok && (st == ReasonMemberConflict || st == ReasonNotMember) {
		return &apiError{code: codes.FailedPrecondition, reason: st, msg: err.Error()}
	}
	return err
}

// statusReason returns the reason of a gRPC error answered by dlockd (the
// text in parentheses at the end of its message).
func statusReason(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	msg := err.Error()
	if n := len(msg); n > 0 && msg[n-1] == ')' {
		for i := n - 2; i >= 0; i-- {
			if msg[i] == '(' {
				return msg[i+1 : n-1], true
			}
		}
	}
	return "", false
}

// The first start of an initial member (bootstrapLoop).
//
// A node started with InitialCluster on an empty data directory looks
// exactly like the first start of a new cluster, and so does an old member
// whose data directory was wiped and that an operator started again with
// the same flags. The latter must not vote or acknowledge anything: it may
// have voted in a term and acknowledged entries it no longer has, and with
// an empty log it would vote for a lagging candidate (E-1: a follower that
// missed a committed grant won an election with the wiped member's vote,
// and the grant was lost). So such a node starts Raft with no
// configuration and its Raft port shut (Raft connections are closed; it
// dials no one) and first probes the other initial members on their Raft
// port (raftnet.go: the same mutual TLS, a first byte Raft never sends):
// "do you have Raft state, and which incarnation does your members
// registry record for my node ID?". Then:
//
//   - a member records an incarnation for this ID (other than this data
//     directory's): the node was a member, registered, and lost its data.
//     It takes no part and says so (Failed receives ErrWipedMember; dlockd
//     exits): remove the old member (dlock cluster remove ID) and start
//     the node with --join on an empty data directory;
//   - no member that answers has a log beyond its bootstrap (last index
//     1 or nothing): a new cluster whose members are all starting. The
//     node bootstraps once every other initial member has answered (a
//     member that has not answered may hold this node's record: two wiped
//     members must not form a majority of empty logs). A new cluster thus
//     forms once every initial member has started, in any order;
//   - some member has a longer log: the cluster has run, and this node is
//     either a late first start or a member that lost its data before its
//     registration reached anyone that answers. It first registers with
//     the leader (an AddVoter marked as a registration: the leader records
//     its incarnation, or refuses it when it records another one, or when
//     the ID is not in its configuration), and bootstraps only then. With
//     no leader known it waits: it takes part only in a cluster whose
//     quorum elected a leader without it, and that leader holds every
//     committed entry;
//   - nobody answers: it keeps asking, logging every 5s, until Shutdown.
//
// What is left: a member answers from what it has applied, and the node's
// vote is not fenced by term: a member that lost its data while it had
// voted in the leader's current term (or in a term a stale, partitioned
// candidate still campaigns in) could vote a second time in that term
// once it takes part again. hashicorp/raft's pre-vote makes this need a
// candidate that nobody has heard from the leader about. The operator's
// rule stays: --initial-cluster is for the first start of a new cluster;
// a member that lost its data rejoins with remove and --join.

// probeInterval is the pause between two rounds of probes of a node
// waiting to bootstrap; probeTimeout bounds one probe.
const (
	probeInterval = 250 * time.Millisecond
	probeTimeout  = time.Second
)

// ErrUndecodableEntry is the error (wrapped) on Failed of a node whose FSM
// met a committed command entry it could not decode, such as a batched
// entry (log format of this release) replayed by an older dlockd, or a
// command of a newer one. The node stops serving (see Server.undecodable).
var ErrUndecodableEntry = errors.New("dlockd: a committed log entry does not decode on this node")

// ErrWipedMember is the error (wrapped) of a node refused because the
// cluster records another data directory under its node ID: it was a
// member and lost its data. See Failed.
var ErrWipedMember = errors.New("dlockd: this node ID is a member of the cluster with another data directory")

// otherInitialMembers returns how many members of Config.InitialCluster
// are not this node.
func (s *Server) otherInitialMembers() int {
	n := 0
	for _, p := range s.cfg.InitialCluster {
		if p.ID != s.cfg.NodeID {
			n++
		}
	}
	return n
}

// answerProbe answers a membership probe (raftnet.go) from this node's
// state: whether it has Raft state, and the incarnation its registry
// records for the asking ID.
func (s *Server) answerProbe(req probeRequest) probeAnswer {
	a := probeAnswer{NodeID: s.cfg.NodeID, HasState: s.hasState.Load()}
	if m, ok := s.fsm.member(req.ID); ok {
		a.Incarnation = m.incarnation
	}
	if s.raftUp.Load() {
		a.LastIndex, a.Term = s.raft.LastIndex(), s.raft.CurrentTerm()
		_, a.LeaderAPI = s.leaderAPI()
	}
	return a
}

// Failed returns a channel that receives, once, the error that keeps this
// node out of the cluster for good (ErrWipedMember: its node ID is a
// member with another data directory). The node stays up (its API answers
// NOT_LEADER) but takes no part in Raft; dlockd exits on it.
func (s *Server) Failed() <-chan error { return s.failed }

// fail logs err and sends it on Failed (once).
func (s *Server) fail(err error) {
	s.log.Error("dlockd: this node takes no part in the cluster", "err", err)
	select {
	case s.failed <- err:
	default:
	}
}

// bootstrapLoop probes the other initial members until their answers allow
// this node, started with InitialCluster on an empty data directory, to
// bootstrap conf and open its Raft port (see the comment above), or refuse
// it. It ends on Shutdown.
func (s *Server) bootstrapLoop(conf raft.Configuration) {
	defer s.loops.Done()
	lastLog := time.Now()
	for {
		ok, waiting, err := s.probeRound()
		if err != nil {
			s.fail(err)
			return
		}
		if ok {
			break
		}
		if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			s.log.Warn("dlockd: first start: waiting for the other initial members to answer before taking part (a member that lost its data must not vote)", "node", s.cfg.NodeID, "waiting_for", waiting)
		}
		select {
		case <-s.stopCh:
			return
		case <-time.After(probeInterval):
		}
	}
	if err := s.raft.BootstrapCluster(conf).Error(); err != nil {
		s.fail(fmt.Errorf("dlockd: bootstrap: %w", err))
		return
	}
	s.hasState.Store(true)
	s.stream.setOpen(true)
	s.log.Info("dlockd: first start: bootstrapped the initial cluster", "node", s.cfg.NodeID, "voters", len(conf.Servers))
}

// probeRound probes every other initial member at once and returns
// whether this node may bootstrap, the members that did not answer, or
// the error (ErrWipedMember) that refuses it.
func (s *Server) probeRound() (ok bool, waiting []string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	go func() {
		select {
		case <-s.stopCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	type result struct {
		id  string
		a   probeAnswer
		err error
	}
	var peers []Peer
	for _, p := range s.cfg.InitialCluster {
		if p.ID != s.cfg.NodeID {
			peers = append(peers, p)
		}
	}
	ch := make(chan result, len(peers))
	for _, p := range peers {
		go func() {
			a, err := s.stream.probe(ctx, p.RaftAddr, probeRequest{ID: s.cfg.NodeID})
			ch <- result{id: p.ID, a: a, err: err}
		}()
	}
	answered, established := 0, 0
	var leaders []string
	for range peers {
		r := <-ch
		if r.err != nil {
			waiting = append(waiting, r.id)
			continue
		}
		answered++
		if r.a.HasState && r.a.LastIndex > 1 {
			established++
		}
		if r.a.LeaderAPI != "" {
			leaders = append(leaders, r.a.LeaderAPI)
		}
		if r.a.Incarnation != "" && r.a.Incarnation != s.incarnation && err == nil {
			err = s.wipedErr(fmt.Sprintf("member %s records node %q with incarnation %s", r.id, s.cfg.NodeID, r.a.Incarnation))
		}
	}
	if err != nil {
		return false, nil, err
	}
	sort.Strings(waiting)
	if established == 0 {
		// A new cluster: go once every other member answered.
		return answered == len(peers), waiting, nil
	}
	// A running cluster: register with its leader first.
	if len(leaders) == 0 {
		return false, append(waiting, "a leader"), nil
	}
	rctx, rcancel := context.WithTimeout(context.Background(), s.cfg.ApplyTimeout+time.Second)
	defer rcancel()
	go func() {
		select {
		case <-s.stopCh:
			rcancel()
		case <-rctx.Done():
		}
	}()
	if err := s.registerFirst(rctx, leaders[0]); err != nil {
		var ae *apiError
		if errors.As(err, &ae) || errors.Is(err, ErrWipedMember) {
			return false, nil, err
		}
		s.log.Debug("dlockd: first start: registration with the leader not done yet", "leader", leaders[0], "err", err)
		return false, append(waiting, "the leader at "+leaders[0]), nil
	}
	return true, nil, nil
}

// wipedErr returns the ErrWipedMember refusal of this node, saying why.
func (s *Server) wipedErr(why string) error {
	return fmt.Errorf("%w: %s, and this data directory (%s) has %s: the node was a member and lost its data (wiped or replaced), so it cannot take part as if it held the old log; remove the old member (dlock cluster remove %s), then start this node with --join and an empty data directory",
		ErrWipedMember, why, s.cfg.DataDir, s.incarnation, s.cfg.NodeID)
}

// registerFirst registers this node (API address, incarnation) with the
// leader at api before it takes part. A node ID the leader records with
// another incarnation (MEMBER_CONFLICT) or does not have in its
// configuration (ReasonNotMember) is refused with an *apiError; other
// errors are worth a retry.
func (s *Server) registerFirst(ctx context.Context, api string) error {
	c, err := s.peers.client(api)
	if err != nil {
		return err
	}
	ctx = metadata.AppendToOutgoingContext(forwardCtx(ctx), registerKey, "1")
	_, err = c.AddVoter(ctx, &dlockv1.AddVoterRequest{Id: s.cfg.NodeID, RaftAddr: string(s.transport.LocalAddr()), ApiAddr: s.apiAdvertise(), Incarnation: s.incarnation})
	switch r, _ := statusReason(err); r {
	case ReasonMemberConflict:
		return s.wipedErr("the leader refused its registration: " + err.Error())
	case ReasonNotMember:
		return &apiError{code: codes.FailedPrecondition, reason: r, msg: fmt.Sprintf("node %q is not in the running cluster's configuration (removed, or never a member): start it with --join and an empty data directory: %v", s.cfg.NodeID, err)}
	}
	return err
}

// transferLeadership runs start (raft's LeadershipTransfer or
// LeadershipTransferToServer) and returns its error. From before the
// transfer starts until this node is no longer the leader (or, when the
// transfer failed, one heartbeat timeout after), renewals and reads are
// refused instead of answered from this node's memory.
//
// Why: the renewal argument (package doc, step 3) relies on followers not
// voting for another candidate while they hear from this leader. A
// transfer's TimeoutNow lets the target's election skip that wait, so a
// VerifyLeader round counting a heartbeat acknowledged just before a
// follower voted for the target could confirm a renewal whose sender's
// validity outlives the target's restarted countdown by up to a network
// round trip. Refusing during the transfer closes that window: the client
// retries at the new leader.
func (s *Server) transferLeadership(start func() raft.Future) error {
	s.transferring.Add(1)
	err := start().Error()
	if err == nil {
		// The transfer succeeded: this node has stepped down or is about
		// to. Keep refusing until it is no longer ready (bounded).
		go func() {
			t := time.NewTimer(s.cfg.ElectionTimeout * 10)
			defer t.Stop()
			for s.ready.Load() {
				select {
				case <-t.C:
					s.transferring.Add(-1)
					return
				case <-s.stopCh:
					s.transferring.Add(-1)
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
			s.transferring.Add(-1)
		}()
		return nil
	}
	// A failed transfer may still have sent TimeoutNow: keep refusing for
	// a heartbeat timeout, the longest a late election could follow it.
	time.AfterFunc(s.cfg.HeartbeatTimeout, func() { s.transferring.Add(-1) })
	return err
}
