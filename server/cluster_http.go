package server

import (
	"net/http"
	"time"

	dlockv1 "github.com/dlock-dev/dlock/proto/dlock/v1"
)

// clusterRoutes adds the Cluster service's JSON routes to mux:
//
//	GET  /v1/cluster/status            members, leader, term (?local=true: this node's own entry)
//	POST /v1/cluster/add               {"id", "raft_addr", "api_addr"}
//	POST /v1/cluster/remove            {"id"}
//	POST /v1/cluster/transfer-leader   {"id"} (optional: any voter)
//
// They answer what the gRPC calls answer, with the same errors. On a node
// that is not the leader the HTTP forwarder (forward.go) sends them to the
// leader, except a status with local=true.
func clusterRoutes(s *Server, mux *http.ServeMux) {
	c := &clusterAPI{s: s}
	mux.HandleFunc("GET /v1/cluster/status", func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		v := r.URL.Query().Get("local")
		resp, err := c.Status(r.Context(), &dlockv1.ClusterStatusRequest{Local: v == "true" || v == "1"})
		s.requestDone(transportHTTP, "cluster-status", "", err, start)
		writeReply(w, resp, err)
	})
	mux.Handle("POST /v1/cluster/status", unary(s, "cluster-status", func() *dlockv1.ClusterStatusRequest { return new(dlockv1.ClusterStatusRequest) }, c.Status))
	mux.Handle("POST /v1/cluster/add", unary(s, "cluster-add", func() *dlockv1.AddVoterRequest { return new(dlockv1.AddVoterRequest) }, c.AddVoter))
	mux.Handle("POST /v1/cluster/remove", unary(s, "cluster-remove", func() *dlockv1.RemoveServerRequest { return new(dlockv1.RemoveServerRequest) }, c.RemoveServer))
	mux.Handle("POST /v1/cluster/transfer-leader", unary(s, "cluster-transfer-leader", func() *dlockv1.TransferLeaderRequest { return new(dlockv1.TransferLeaderRequest) }, c.TransferLeader))
}
