package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-dev/dlock/drivers/dlockddriver"
	"github.com/dlock-dev/dlock/internal/tlserr"
)

// dlockd's cluster API over HTTP (the same port as gRPC). A follower
// forwards these calls to the leader.
const (
	clusterStatusPath   = "/v1/cluster/status"
	clusterAddPath      = "/v1/cluster/add"
	clusterRemovePath   = "/v1/cluster/remove"
	clusterTransferPath = "/v1/cluster/transfer-leader"
)

// defaultClusterTimeout is --timeout's default: how long one member has to
// answer one call. A membership change waits for the new configuration to
// commit, so it is longer than an inspection's.
const defaultClusterTimeout = 15 * time.Second

// dlockdDefaultPort is the port of a member given without one.
const dlockdDefaultPort = "7450"

func newClusterCmd(g *globals) *cobra.Command {
	cc := &clusterCmd{g: g}
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Show and change the members of a dlockd cluster",
		Long: `The cluster commands show and change the members of a dlockd cluster.

The store URL (--store, DLOCK_STORE or the configuration file) names one
or more members: dlockd://h1:7450,h2:7450,h3:7450. Each command asks the
members in that order until one answers; a follower forwards the call to
the leader, so any live member will do. A member that refuses the
connection or answers "no leader" is skipped; when none answers the
command retries for --retry-for (default 5s), then exits 69 naming each
member's problem.

Membership changes one voter at a time: dlockd refuses a change while the
previous one is not committed.

Exit status: 0 on success, 64 for bad arguments (or a request dlockd
refused as invalid), 69 when no member could be reached or the cluster has
no leader, 78 when the store is not dlockd or the server has no cluster
API, 1 for anything else dlockd refused (an unknown member, a change in
progress). With -o json an error is {"error", "code", "exit_code"} on
stdout.`,
		Example: `  dlock --store dlockd://10.0.0.1:7450,10.0.0.2:7450,10.0.0.3:7450 cluster status
  dlock cluster status -o json
  dlock cluster add --id n4 --raft-addr 10.0.0.4:7451 --api-addr 10.0.0.4:7450
  dlock cluster remove n2
  dlock cluster transfer-leader n3`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return exit(ExitUsage, "unknown command %q for cluster (status, add, remove, transfer-leader)", args[0])
			}
			return exit(ExitUsage, "cluster needs a command: status, add, remove or transfer-leader")
		},
		RunE: func(cmd *cobra.Command, args []string) error { return nil },
	}
	pf := cmd.PersistentFlags()
	pf.DurationVar(&g.retryFor, "retry-for", DefaultRetryFor, "retry this long while no member can be reached (down, restarting, electing a leader) before exiting 69 (env DLOCK_RETRY_FOR, file: retry_for)")
	pf.DurationVar(&cc.timeout, "timeout", defaultClusterTimeout, "how long one member has to answer one call")
	cmd.AddCommand(cc.statusCmd(), cc.addCmd(), cc.removeCmd(), cc.transferCmd())
	return cmd
}

// clusterCmd holds the flags the cluster commands share.
type clusterCmd struct {
	g       *globals
	timeout time.Duration
}

func (cc *clusterCmd) statusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the members, the leader and its term",
		Long: `Status shows every member of the cluster: its node ID, its API address
(what clients dial), its Raft address, whether it is a voter, a * on the
leader, how long ago the leader last heard from it and the last log index
it applied as the leader knows it ("-" where unknown), and whether it
reads log entries of several commands (READS BATCHES: a dlockd before
batching does not), with the leader, its term and whether the leader
writes such entries now ("batching on", or "off": dlockd --batching off,
or a member that does not read them or did not answer; the leader's log
names it). A follower that answers does not know the last: the leader is
asked for it.

With -o json: {"node_id" (the member that answered), "leader_id",
"leader_api", "term", "answered_by" (the address asked), "batching" (the
leader writes batch entries), "members": [{"id", "api_addr", "raft_addr",
"voter", "leader", "state" (Leader, Follower, Candidate), "term",
"last_contact_seconds", "applied_index", "batch_entries" (reads batch
entries), "error" (why the member's own state is unknown)}]}; term,
last_contact_seconds, applied_index, batching and batch_entries are null
when unknown.

Exit status: 0 when the status shows a leader; 69 when no member could be
reached, or when the member that answered knows no leader (no quorum, or
an election under way): the status is printed all the same (with -o json,
the status object, leader_id empty).`,
		Example: `  dlock --store dlockd://127.0.0.1:7450,127.0.0.1:7460,127.0.0.1:7470 cluster status`,
		Args:    exactArgs(0, "dlock cluster status"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cc.client()
			if err != nil {
				return err
			}
			st, err := c.status(cmd.Context())
			if err != nil {
				return err
			}
			c.askLeaderBatching(cmd.Context(), st)
			if cc.g.json() {
				cc.g.printJSON(st)
			} else if err := writeClusterStatus(cc.g.stdout, st); err != nil {
				return err
			}
			if st.LeaderID == "" {
				if cc.g.json() {
					return &exitError{code: ExitUnavailable} // the status is the output
				}
				return exit(ExitUnavailable, "cluster status: %s knows no leader: the cluster has no quorum, or an election is under way; retry in a moment, and check that a majority of the voters run", orDash(st.NodeID))
			}
			return nil
		},
	}
}

func (cc *clusterCmd) addCmd() *cobra.Command {
	var id, raftAddr, apiAddr string
	cmd := &cobra.Command{
		Use:   "add --id ID --raft-addr HOST:PORT [--api-addr HOST:PORT]",
		Short: "Add a voter to the cluster",
		Long: `Add adds a voter: the node started with --node-id ID and --raft-bind (or
--raft-advertise) HOST:PORT. --api-addr is the API address clients use to
reach it (its --advertise); the node also registers it itself once it is a
member. dlockd waits until the new configuration is committed, and this
command until the status shows the new voter.

A node started with --join HOST:PORT adds itself the same way; add does it
by hand. Adding a voter already in the configuration at the same Raft
address only records its API address. dlockd refuses (exit 1) an ID that
is a member at another Raft address, or whose data directory was wiped
since it was a member: remove it first.`,
		Example: `  dlock cluster add --id n4 --raft-addr 10.0.0.4:7451 --api-addr 10.0.0.4:7450`,
		Args:    exactArgs(0, "dlock cluster add --id ID --raft-addr HOST:PORT [--api-addr HOST:PORT]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkNodeID("--id", id); err != nil {
				return err
			}
			if err := checkHostPort("--raft-addr", raftAddr, true); err != nil {
				return err
			}
			if apiAddr != "" {
				if err := checkHostPort("--api-addr", apiAddr, true); err != nil {
					return err
				}
			}
			c, err := cc.client()
			if err != nil {
				return err
			}
			body := map[string]string{"id": id, "raft_addr": raftAddr, "api_addr": apiAddr}
			a, err := c.call(cmd.Context(), http.MethodPost, clusterAddPath, body, true)
			if err != nil {
				return err
			}
			var resp struct {
				AlreadyMember bool `json:"already_member"`
			}
			_ = json.Unmarshal(a.data, &resp)
			what := "add"
			if resp.AlreadyMember {
				what = "add-existing"
			}
			return cc.reportChange(cmd.Context(), c, what, id, func(st *clusterStatus) bool {
				m := st.member(id)
				return m != nil && m.Voter
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&id, "id", "", "node ID of the new voter (its --node-id); required")
	f.StringVar(&raftAddr, "raft-addr", "", "Raft address of the new voter, HOST:PORT; required")
	f.StringVar(&apiAddr, "api-addr", "", "API address clients use to reach the new voter, HOST:PORT (its --advertise)")
	return cmd
}

func (cc *clusterCmd) removeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove ID",
		Short: "Remove a member from the cluster",
		Long: `Remove removes the member with node ID ID. dlockd waits until the new
configuration is committed. Removing the leader makes it step down; the
others elect a new one. Stop the removed node afterwards: it is no longer
part of the cluster, and its data dir cannot be reused to rejoin.`,
		Example: `  dlock cluster remove n2`,
		Args:    exactArgs(1, "dlock cluster remove ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if err := checkNodeID("ID", id); err != nil {
				return err
			}
			c, err := cc.client()
			if err != nil {
				return err
			}
			if _, err := c.call(cmd.Context(), http.MethodPost, clusterRemovePath, map[string]string{"id": id}, false); err != nil {
				return err
			}
			return cc.reportChange(cmd.Context(), c, "remove", id, func(st *clusterStatus) bool { return st.member(id) == nil })
		},
	}
}

func (cc *clusterCmd) transferCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "transfer-leader [ID]",
		Short: "Move the leadership to another voter",
		Long: `Transfer-leader asks the leader to hand its leadership to the voter ID,
or to the most up-to-date other voter when no ID is given, and waits
(up to --timeout) until the new leader is elected. Leases survive the
change: the new leader restarts their countdowns. When another voter wins
instead (the one named could not win its election), it exits 1 naming the
leader there is.`,
		Example: `  dlock cluster transfer-leader
  dlock cluster transfer-leader n3`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return exit(ExitUsage, "usage: dlock cluster transfer-leader [ID] (got %d arguments)", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			id := ""
			if len(args) == 1 {
				id = args[0]
				if err := checkNodeID("ID", id); err != nil {
					return err
				}
			}
			c, err := cc.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			before, err := c.status(ctx)
			if err != nil {
				return err
			}
			if id != "" && before.LeaderID == id {
				return cc.reportLeader(before, fmt.Sprintf("%s is already the leader", id))
			}
			if _, err := c.call(ctx, http.MethodPost, clusterTransferPath, map[string]string{"id": id}, false); err != nil {
				return err
			}
			st, err := c.waitStatus(ctx, cc.timeout, func(st *clusterStatus) bool { return newLeader(before, st) })
			if err != nil {
				return exit(1, "transfer-leader: dlockd accepted the transfer but no new leader showed within %v (%v); check dlock cluster status", cc.timeout, err)
			}
			if id != "" && st.LeaderID != id {
				// The target's election failed (it could not reach a
				// voter, say) and another voter won the next one.
				if cc.g.json() {
					cc.g.printJSON(st)
				}
				return exit(1, "transfer-leader: the leadership moved from %s to %s, not to %s: %s's election did not win and %s won the next (term %d); run it again, or check that %s reaches the other voters", before.LeaderID, st.LeaderID, id, id, st.LeaderID, st.Term, id)
			}
			return cc.reportLeader(st, fmt.Sprintf("leadership moved from %s to %s", before.LeaderID, st.LeaderID))
		},
	}
}

// newLeader reports whether st shows a leader other than before's, in a
// later term: the outcome of a transfer, whichever voter won.
func newLeader(before, st *clusterStatus) bool {
	return st.LeaderID != "" && st.LeaderID != before.LeaderID && st.Term > before.Term
}

// reportChange waits until the status shows the change (done), then prints
// what was done and the members.
func (cc *clusterCmd) reportChange(ctx context.Context, c *clusterClient, what, id string, done func(*clusterStatus) bool) error {
	st, err := c.waitStatus(ctx, cc.timeout, done)
	if err != nil {
		return exit(1, "%s %s: dlockd accepted the change but the status does not show it after %v (%v); check dlock cluster status", strings.TrimSuffix(what, "-existing"), id, cc.timeout, err)
	}
	if cc.g.json() {
		cc.g.printJSON(st)
		return nil
	}
	verb := map[string]string{"add": "added", "add-existing": "already a voter:", "remove": "removed"}[what]
	fmt.Fprintf(cc.g.stdout, "%s %s; %d members: %s; leader %s, term %d\n", verb, id, len(st.Members), strings.Join(st.ids(), ", "), orDash(st.LeaderID), st.Term)
	return nil
}

func (cc *clusterCmd) reportLeader(st *clusterStatus, msg string) error {
	if cc.g.json() {
		cc.g.printJSON(st)
		return nil
	}
	fmt.Fprintf(cc.g.stdout, "%s (API %s), term %d\n", msg, orDash(st.LeaderAPI), st.Term)
	return nil
}

// client checks the store URL and returns a client of its members.
func (cc *clusterCmd) client() (*clusterClient, error) {
	members, err := clusterMembers(cc.g.store)
	if err != nil {
		return nil, err
	}
	if cc.timeout <= 0 {
		return nil, exit(ExitUsage, "--timeout must be positive, got %v", cc.timeout)
	}
	tlsCfg, scheme, err := storeTLS(cc.g.store)
	if err != nil {
		return nil, err
	}
	token, err := cc.g.storeToken()
	if err != nil {
		return nil, err
	}
	if token != "" && tlsCfg == nil {
		for _, m := range members {
			if !loopbackAddr(m) {
				return nil, exit(ExitUsage, "--store: a token would travel in clear to %s: add tls=1 (and ca=FILE) to the store URL, or use a loopback address", m)
			}
		}
	}
	serverName := ""
	if tlsCfg != nil {
		serverName = tlsCfg.ServerName
	}
	return &clusterClient{
		serverName: serverName,
		members:    members,
		timeout:    cc.timeout,
		retryFor:   cc.g.retryFor,
		scheme:     scheme,
		token:      token,
		hc: &http.Client{
			Transport: &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 3 * time.Second}).DialContext, MaxIdleConnsPerHost: 2, TLSClientConfig: tlsCfg},
			// A follower forwards; a redirect (307 to the leader) is
			// followed by hand, so the body is sent again.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

// storeTLS returns the TLS configuration of a dlockd store URL's tls, ca,
// cert, key and server_name parameters (dlockddriver.TLSConfig, as the
// driver dials) and the scheme of its HTTP calls: "https" with TLS, else
// "http" and a nil configuration. A bad parameter or file exits 64.
func storeTLS(store string) (*tls.Config, string, error) {
	u, err := url.Parse(store)
	if err != nil {
		return nil, "", exit(ExitUsage, "--store: not a valid URL: %v", errors.Unwrap(err))
	}
	cfg, err := dlockddriver.TLSConfig(u)
	if err != nil {
		return nil, "", &exitError{code: ExitUsage, err: err}
	}
	if cfg == nil {
		return nil, "http", nil
	}
	return cfg, "https", nil
}

// loopbackAddr reports whether host:port names a loopback address.
func loopbackAddr(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// storeToken returns the bearer token of the store for HTTP calls to
// dlockd: --token (DLOCK_TOKEN, config token) or the URL's token_file, as
// the driver reads them (dlockddriver.Token). Exit 64 when it is refused.
func (g *globals) storeToken() (string, error) {
	u := g.storeURL()
	if u == nil {
		return "", nil
	}
	ctx := context.Background()
	if g.token != "" {
		ctx = dlockddriver.ContextWithToken(ctx, g.token)
	}
	tok, err := dlockddriver.Token(ctx, u)
	if err != nil {
		return "", &exitError{code: ExitUsage, err: err}
	}
	return tok, nil
}

// clusterMembers returns the members named by a dlockd store URL, as
// host:port (port 7450 where none is given): exit 64 for a URL that does
// not parse or names no host, 78 for a store that is not dlockd.
func clusterMembers(store string) ([]string, error) {
	if !strings.Contains(store, "://") {
		hint := ""
		if _, _, err := net.SplitHostPort(store); err == nil {
			hint = fmt.Sprintf("; did you mean --store dlockd://%s ?", store)
		}
		return nil, exit(ExitUsage, "--store %q is not a store URL (dlockd://HOST:PORT[,HOST:PORT...])%s", store, hint)
	}
	u, err := url.Parse(store)
	if err != nil {
		return nil, exit(ExitUsage, "--store: not a valid URL: %v", errors.Unwrap(err))
	}
	if u.Scheme != "dlockd" {
		return nil, exit(ExitUnsupported, "dlock cluster works with dlockd only; the store is %s:// (give --store dlockd://HOST:PORT,...)", u.Scheme)
	}
	var out []string
	for _, hp := range strings.Split(u.Host, ",") {
		if hp == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(hp); err != nil {
			hp = net.JoinHostPort(strings.Trim(hp, "[]"), dlockdDefaultPort)
		}
		if err := checkHostPort("--store", hp, false); err != nil {
			return nil, err
		}
		if !slices.Contains(out, hp) {
			out = append(out, hp)
		}
	}
	if len(out) == 0 {
		return nil, exit(ExitUsage, "--store %q names no dlockd member (dlockd://HOST:PORT[,HOST:PORT...])", u.Redacted())
	}
	return out, nil
}

// checkHostPort refuses an address that is not HOST:PORT with a port in
// 1-65535 (exit 64). needHost: the host must not be empty.
func checkHostPort(what, addr string, needHost bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return exit(ExitUsage, "%s %q is not HOST:PORT", what, addr)
	}
	if needHost && host == "" {
		return exit(ExitUsage, "%s %q names no host (HOST:PORT)", what, addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return exit(ExitUsage, "%s %q: port %q is not a TCP port (1-65535)", what, addr, port)
	}
	return nil
}

// checkNodeID refuses an empty node ID or one with a control character or
// a space (exit 64).
func checkNodeID(what, id string) error {
	switch {
	case id == "":
		return exit(ExitUsage, "%s: a node ID is required", what)
	case len(id) > 256:
		return exit(ExitUsage, "%s: a node ID must be at most 256 bytes, got %d", what, len(id))
	case needsQuote(id) || strings.ContainsAny(id, " ,="):
		return exit(ExitUsage, "%s %s: a node ID must not hold spaces, commas, '=' or control characters", what, strconv.Quote(id))
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// clusterStatus is the cluster's status as dlock prints it with -o json.
type clusterStatus struct {
	NodeID     string `json:"node_id"`
	LeaderID   string `json:"leader_id"`
	LeaderAPI  string `json:"leader_api"`
	Term       uint64 `json:"term"`
	AnsweredBy string `json:"answered_by"`
	// Batching: the leader writes several commands per log entry (its
	// batch gate, dlockd --batching), as the leader answered (asked
	// again when a follower answered); null when it could not be asked.
	Batching *bool           `json:"batching"`
	Members  []clusterMember `json:"members"`
}

// clusterMember is one member in clusterStatus.
type clusterMember struct {
	ID                 string   `json:"id"`
	APIAddr            string   `json:"api_addr"`
	RaftAddr           string   `json:"raft_addr"`
	Voter              bool     `json:"voter"`
	Leader             bool     `json:"leader"`
	State              string   `json:"state,omitempty"`
	Term               *uint64  `json:"term"`
	LastContactSeconds *float64 `json:"last_contact_seconds"`
	AppliedIndex       *uint64  `json:"applied_index"`
	// BatchEntries: the member reads log entries of several commands
	// (a version before batching does not), whether or not the leader
	// writes them; null when its own state is unknown (Error).
	BatchEntries *bool  `json:"batch_entries"`
	Error        string `json:"error,omitempty"`
}

func (st *clusterStatus) member(id string) *clusterMember {
	for i := range st.Members {
		if st.Members[i].ID == id {
			return &st.Members[i]
		}
	}
	return nil
}

func (st *clusterStatus) ids() []string {
	out := make([]string, len(st.Members))
	for i, m := range st.Members {
		out[i] = m.ID
	}
	return out
}

// writeClusterStatus prints st as a line on the leader and a table of the
// members.
func writeClusterStatus(w io.Writer, st *clusterStatus) error {
	if st.LeaderID != "" {
		batching := ""
		if st.Batching != nil {
			batching = "; batching off (one log entry per command)"
			if *st.Batching {
				batching = "; batching on"
			}
		}
		fmt.Fprintf(w, "leader %s (API %s), term %d%s; answered by %s (%s)\n", quoteIfControl(st.LeaderID), orDash(st.LeaderAPI), st.Term, batching, orDash(st.NodeID), st.AnsweredBy)
	} else {
		fmt.Fprintf(w, "no leader known (an election may be under way), term %d; answered by %s (%s)\n", st.Term, orDash(st.NodeID), st.AnsweredBy)
	}
	rows := [][]string{{"ID", "API", "RAFT", "VOTER", "LEADER", "STATE", "LAST CONTACT", "APPLIED", "READS BATCHES"}}
	var problems []string
	for _, m := range st.Members {
		if m.Error != "" {
			problems = append(problems, fmt.Sprintf("  %s: %s", quoteIfControl(m.ID), quoteIfControl(plainCause(errors.New(m.Error)))))
		}
		voter, leader, contact, applied, batch := "no", "", "-", "-", "-"
		if m.BatchEntries != nil {
			batch = "no"
			if *m.BatchEntries {
				batch = "yes"
			}
		}
		if m.Voter {
			voter = "yes"
		}
		if m.Leader {
			leader = "*"
		}
		if m.LastContactSeconds != nil && !m.Leader {
			contact = formatContact(*m.LastContactSeconds)
		}
		if m.AppliedIndex != nil {
			applied = strconv.FormatUint(*m.AppliedIndex, 10)
		}
		rows = append(rows, []string{quoteIfControl(m.ID), orDash(quoteIfControl(m.APIAddr)), orDash(quoteIfControl(m.RaftAddr)), voter, leader, orDash(quoteIfControl(m.State)), contact, applied, batch})
	}
	if err := writeTable(w, rows); err != nil {
		return err
	}
	if len(problems) > 0 {
		_, err := fmt.Fprintf(w, "members whose own state is unknown:\n%s\n", strings.Join(problems, "\n"))
		return err
	}
	return nil
}

// formatContact prints a last-contact age in seconds as "12ms" or "3.2s".
func formatContact(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d < 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(100 * time.Millisecond).String()
	}
}

// clusterClient calls dlockd's cluster API on the first member that answers.
type clusterClient struct {
	members []string // host:port, in the URL's order
	scheme  string   // "https" when the store URL asks for TLS, else "http"
	// serverName is the store URL's server_name ("": the host dialled),
	// for explaining a server certificate that does not name it.
	serverName string
	token      string // bearer token (--token, DLOCK_TOKEN, token_file), or ""
	timeout    time.Duration
	retryFor   time.Duration
	hc         *http.Client
}

// apiError is an answer of dlockd other than success and "no leader":
// {"code", "reason", "message"} with its HTTP status.
type apiError struct {
	Status   int    `json:"-"`
	Code     string `json:"code"`
	Reason   string `json:"reason"`
	Message  string `json:"message"`
	Leader   string `json:"leader"`
	LeaderID string `json:"leader_id"`
}

// memberProblem is why one member did not answer.
type memberProblem struct {
	addr  string
	cause string
	err   error
}

// unreachableError lists each member's problem.
type unreachableError struct {
	problems []memberProblem
}

func (e *unreachableError) Error() string {
	parts := make([]string, len(e.problems))
	for i, p := range e.problems {
		parts[i] = p.addr + ": " + p.cause
	}
	return strings.Join(parts, "; ")
}

// allTLS reports whether every member's problem is about TLS (they
// answered; the certificates did not agree).
func (e *unreachableError) allTLS() bool {
	for _, p := range e.problems {
		if !tlsCause(p.cause) {
			return false
		}
	}
	return len(e.problems) > 0
}

// status returns the cluster's status from the first member that answers.
func (c *clusterClient) status(ctx context.Context) (*clusterStatus, error) {
	body, err := c.call(ctx, http.MethodGet, clusterStatusPath, nil, true)
	if err != nil {
		return nil, err
	}
	st, derr := decodeClusterStatus(body.data)
	if derr != nil {
		return nil, exit(1, "cluster status: %s answered something that is not a cluster status: %v", body.addr, derr)
	}
	st.AnsweredBy = body.addr
	return st, nil
}

// askLeaderBatching fills st.Batching, which only the leader knows, when a
// follower answered: it asks the leader for its own entry, once, without
// retries (the status stands without it). Only dlock cluster status needs
// it, not the commands that poll the status for a change.
func (c *clusterClient) askLeaderBatching(ctx context.Context, st *clusterStatus) {
	if st.Batching != nil || st.LeaderAPI == "" || st.LeaderID == "" {
		return
	}
	lc := *c
	lc.members, lc.retryFor = []string{st.LeaderAPI}, 0
	if lb, err := lc.call(ctx, http.MethodGet, clusterStatusPath+"?local=true", nil, true); err == nil {
		if ls, err := decodeClusterStatus(lb.data); err == nil && ls.NodeID == st.LeaderID {
			st.Batching = ls.Batching
		}
	}
}

// waitStatus polls the status until done(status) holds or timeout passes.
func (c *clusterClient) waitStatus(ctx context.Context, timeout time.Duration, done func(*clusterStatus) bool) (*clusterStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		st, err := c.status(ctx)
		if err == nil && done(st) {
			return st, nil
		}
		if err != nil {
			last = err
		} else {
			last = errors.New("not shown yet")
		}
		select {
		case <-ctx.Done():
			return nil, last
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// answer is a successful call's body and the member that gave it.
type answer struct {
	addr string
	data []byte
}

// call sends one request to the members in turn until one answers, and
// retries for c.retryFor while none does. A member that refuses the
// connection, cannot be dialled or answers 503 (no leader, shutting down)
// is skipped; a 503 naming the leader sends the request there next. A
// request that may have reached a member without an answer (a timeout
// after it was sent) is retried elsewhere only when idempotent. Errors:
// exit 69 when no member answered, the mapping of apiStatusErr for a
// refusal.
func (c *clusterClient) call(ctx context.Context, method, path string, body any, idempotent bool) (answer, error) {
	var payload []byte
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return answer{}, exit(1, "cluster: %v", err)
		}
		payload = b
	}
	start := time.Now()
	pause := 100 * time.Millisecond
	for {
		a, unreachable, err := c.round(ctx, method, path, payload, idempotent)
		if unreachable == nil {
			return a, err
		}
		elapsed := time.Since(start)
		if elapsed >= c.retryFor || ctx.Err() != nil {
			after := ""
			if elapsed >= 100*time.Millisecond {
				after = fmt.Sprintf(", still after retrying for %v", elapsed.Round(100*time.Millisecond))
			}
			hint := "are the members running? set --store dlockd://HOST:PORT,... or give --retry-for a longer budget"
			if unreachable.allTLS() {
				hint = "check the store URL's TLS parameters (tls, ca, cert, key, server_name) against the members' certificates"
			}
			return answer{}, &exitError{code: ExitUnavailable, detail: unreachable,
				err: fmt.Errorf("cluster %s: no dlockd member answered (%s%s); %s", strings.TrimPrefix(path, "/v1/cluster/"), unreachable, after, hint)}
		}
		select {
		case <-ctx.Done():
		case <-time.After(min(jittered(pause), c.retryFor-elapsed)):
		}
		pause = min(2*pause, time.Second)
	}
}

// round tries every member once (and the leaders they name). It returns
// the answer, or a non-nil unreachable when no member answered, or the
// final error of a refusal or of an uncertain outcome.
func (c *clusterClient) round(ctx context.Context, method, path string, payload []byte, idempotent bool) (answer, *unreachableError, error) {
	queue := slices.Clone(c.members)
	tried := map[string]bool{}
	un := &unreachableError{}
	for len(queue) > 0 {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		status, data, hdr, err := c.send(ctx, addr, method, path, payload)
		if err != nil {
			if why := tlsRefusedCause(err); why != "" { // exit 77: retrying cannot help
				return answer{}, nil, &exitError{code: ExitNoPerm, detail: err,
					err: fmt.Errorf("cluster %s: %s: %s; set cert=FILE and key=FILE in the store URL to a valid certificate issued by dlockd's --tls-client-ca", strings.TrimPrefix(path, "/v1/cluster/"), addr, why)}
			}
			if ctx.Err() != nil {
				return answer{}, nil, exit(ExitUnavailable, "cluster %s: %v", strings.TrimPrefix(path, "/v1/cluster/"), ctx.Err())
			}
			if !idempotent && !isDialError(err) {
				return answer{}, nil, &exitError{code: ExitUnavailable, detail: err,
					err: fmt.Errorf("cluster %s: %s did not answer (%s); the change may or may not have been applied: check dlock cluster status", strings.TrimPrefix(path, "/v1/cluster/"), addr, plainCause(err))}
			}
			cause := plainCause(err)
			if why, ok := tlserr.ServerCert(err, c.serverName); ok { // with the server_name checked
				cause = why
			}
			un.problems = append(un.problems, memberProblem{addr: addr, cause: cause, err: err})
			continue
		}
		switch {
		case status >= 200 && status < 300:
			return answer{addr: addr, data: data}, nil, nil
		case status == http.StatusTemporaryRedirect || status == http.StatusPermanentRedirect:
			if leader := redirectHost(hdr.Get("Location")); leader != "" {
				queue = append([]string{leader}, queue...)
			}
			un.problems = append(un.problems, memberProblem{addr: addr, cause: "redirected to the leader"})
			continue
		case status == http.StatusServiceUnavailable || notLeader(parseAPIError(status, data)):
			ae := parseAPIError(status, data)
			leader := ae.Leader
			if leader == "" {
				leader = hdr.Get("Dlock-Leader")
			}
			if refusedByLeader(ae, addr, leader) {
				return answer{}, nil, apiStatusErr(path, addr, ae)
			}
			if leader != "" && !tried[leader] {
				queue = append([]string{leader}, queue...)
			}
			cause := plainCause(errors.New(ae.Message + " " + ae.Reason))
			un.problems = append(un.problems, memberProblem{addr: addr, cause: cause, err: errors.New(ae.Message)})
			continue
		}
		return answer{}, nil, apiStatusErr(path, addr, parseAPIError(status, data))
	}
	return answer{}, un, nil
}

// refusedByLeader reports whether a 503 answer of the member at addr is
// the leader's refusal rather than "no leader here": a dlockd answer whose
// reason is neither NOT_LEADER nor SHUTTING_DOWN (a leadership transfer
// that failed), or a NOT_LEADER answer naming addr itself as the leader
// (an older dlockd's refused transfer), unless it says the leader is still
// catching up on its log (a new leader about to serve).
func refusedByLeader(ae *apiError, addr, leader string) bool {
	if ae.Code != "" && ae.Reason != "" && ae.Reason != "NOT_LEADER" && ae.Reason != "SHUTTING_DOWN" && !notLeader(ae) {
		return true
	}
	return notLeader(ae) && leader != "" && leader == addr && !strings.Contains(ae.Message, "catching up")
}

// notLeader reports whether a refusal says the cluster has no leader (or
// the member asked is not it), whatever its HTTP status: a forwarded call
// may come back wrapped in another code.
func notLeader(ae *apiError) bool {
	return ae.Reason == "NOT_LEADER" || strings.Contains(ae.Message, "(NOT_LEADER)")
}

// send makes one HTTP request to addr, bounded by c.timeout.
func (c *clusterClient) send(ctx context.Context, addr, method, path string, payload []byte) (int, []byte, http.Header, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.scheme+"://"+addr+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, data, resp.Header, nil
}

// isDialError reports whether err happened before the request was sent: the
// connection could not be made.
func isDialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "connection refused") || strings.Contains(s, "no such host")
}

// redirectHost returns host:port of a Location URL, or "".
func redirectHost(loc string) string {
	u, err := url.Parse(loc)
	if err != nil || u.Host == "" {
		return ""
	}
	return u.Host
}

func parseAPIError(status int, data []byte) *apiError {
	ae := &apiError{Status: status}
	if err := json.Unmarshal(data, ae); err != nil || (ae.Code == "" && ae.Message == "") {
		ae.Message = strings.TrimSpace(string(data))
		if len(ae.Message) > 200 {
			ae.Message = ae.Message[:200] + "..."
		}
	}
	return ae
}

// plain is the message of an auth refusal without dlockd's "dlockd: "
// prefix and " (REASON)" suffix: it is one line of the CLI's.
func (ae *apiError) plain() string {
	m := strings.TrimPrefix(ae.Message, "dlockd: ")
	if ae.Reason != "" {
		m = strings.TrimSuffix(m, " ("+ae.Reason+")")
	}
	return m
}

// apiStatusErr maps a refusal of dlockd to an exit code: 64 for an invalid
// request, 77 for a token refused (401) or lacking the permission (403),
// 78 when the route is missing (a dlockd without the cluster API, or not a
// dlockd), 1 otherwise (an unknown member, a change in progress).
func apiStatusErr(path, addr string, ae *apiError) error {
	op := strings.TrimPrefix(path, "/v1/cluster/")
	msg := ae.Message
	if ae.Reason != "" && !strings.Contains(msg, ae.Reason) {
		msg = fmt.Sprintf("%s (%s)", msg, ae.Reason)
	}
	switch {
	case ae.Status == http.StatusUnauthorized:
		return exit(ExitNoPerm, "cluster %s: dlockd refused the credentials: %s; set --token, DLOCK_TOKEN or the store URL's token_file=FILE", op, ae.plain())
	case ae.Status == http.StatusForbidden:
		// dlockd's message names the identity and the missing permission.
		return exit(ExitNoPerm, "cluster %s: %s; check the token's rules in dlockd's --auth-file", op, ae.plain())
	case ae.Code == "" && (ae.Status == http.StatusNotFound || ae.Status == http.StatusMethodNotAllowed):
		return exit(ExitUnsupported, "cluster %s: %s has no cluster API (HTTP %d: %s); is it a dlockd of this version?", op, addr, ae.Status, msg)
	case ae.Status == http.StatusBadRequest:
		return exit(ExitUsage, "cluster %s: dlockd refused the request: %s", op, msg)
	case ae.Status == http.StatusNotFound:
		return exit(1, "cluster %s: %s", op, msg)
	}
	return exit(1, "cluster %s: dlockd refused (HTTP %d %s): %s", op, ae.Status, ae.Code, msg)
}

// decodeClusterStatus reads dlockd's status answer (protobuf JSON: 64-bit
// integers may come as strings, durations as "1.5s").
func decodeClusterStatus(data []byte) (*clusterStatus, error) {
	var raw struct {
		NodeID    string            `json:"node_id"`
		LeaderID  string            `json:"leader_id"`
		LeaderAPI string            `json:"leader_api"`
		Term      flexUint          `json:"term"`
		Batching  bool              `json:"batching"`
		Members   []json.RawMessage `json:"members"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, err
	}
	if raw.Members == nil {
		return nil, errors.New("no members field")
	}
	st := &clusterStatus{NodeID: raw.NodeID, LeaderID: raw.LeaderID, LeaderAPI: raw.LeaderAPI, Term: uint64(raw.Term), Members: []clusterMember{}}
	if raw.NodeID != "" && raw.NodeID == raw.LeaderID { // only the leader knows
		st.Batching = &raw.Batching
	}
	for _, rm := range raw.Members {
		var m struct {
			ID           string          `json:"id"`
			APIAddr      string          `json:"api_addr"`
			RaftAddr     string          `json:"raft_addr"`
			Voter        bool            `json:"voter"`
			Leader       bool            `json:"leader"`
			State        string          `json:"state"`
			Term         flexUint        `json:"term"`
			Error        string          `json:"error"`
			LastContact  json.RawMessage `json:"last_contact"`
			AppliedIndex flexUint        `json:"applied_index"`
			BatchEntries bool            `json:"batch_entries"`
		}
		if err := json.Unmarshal(rm, &m); err != nil {
			return nil, err
		}
		cm := clusterMember{ID: m.ID, APIAddr: m.APIAddr, RaftAddr: m.RaftAddr, Voter: m.Voter,
			Leader: m.Leader || (m.ID != "" && m.ID == raw.LeaderID), State: m.State, Error: m.Error}
		if len(m.LastContact) > 0 {
			cm.LastContactSeconds = seconds(m.LastContact)
		}
		if m.AppliedIndex > 0 { // 0: unknown
			v := uint64(m.AppliedIndex)
			cm.AppliedIndex = &v
		}
		if m.Term > 0 {
			v := uint64(m.Term)
			cm.Term = &v
		}
		if m.Error == "" {
			v := m.BatchEntries
			cm.BatchEntries = &v
		}
		st.Members = append(st.Members, cm)
	}
	return st, nil
}

// seconds reads a protobuf JSON Duration ("1.5s") or a number of seconds.
// nil when null, empty or negative (unknown).
func seconds(raw json.RawMessage) *float64 {
	var v float64
	var s string
	switch {
	case string(bytes.TrimSpace(raw)) == "null":
		return nil
	case json.Unmarshal(raw, &v) == nil:
	case json.Unmarshal(raw, &s) == nil && s != "":
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil
		}
		v = d.Seconds()
	default:
		return nil
	}
	if v < 0 {
		return nil
	}
	return &v
}

// flexUint is a uint64 given as a JSON number or as a string (protobuf JSON
// writes 64-bit integers as strings).
type flexUint uint64

// UnmarshalJSON reads 12, "12" or null.
func (f *flexUint) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if s == "null" || s == "" {
		return nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("%s is not an unsigned integer", b)
	}
	*f = flexUint(v)
	return nil
}
