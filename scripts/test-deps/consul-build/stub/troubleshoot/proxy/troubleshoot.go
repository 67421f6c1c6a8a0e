// Package proxy is a stand-in written for dlock's test build of Consul v1.16.0:
// the published module github.com/hashicorp/consul/troubleshoot is not served to
// this build, so `consul troubleshoot` reports that it is unavailable.
package proxy

import (
	"errors"
	"net"
)

var errUnavailable = errors.New("consul troubleshoot is not available in this test build of consul")

// Troubleshoot would inspect a local Envoy's admin API.
type Troubleshoot struct{}

// UpstreamIP describes a transparent-proxy upstream.
type UpstreamIP struct {
	IPs          []string
	IsVirtual    bool
	ClusterNames map[string]struct{}
}

// TestResult is one check's outcome.
type TestResult struct {
	Type            string
	Success         bool
	Message         string
	PossibleActions []string
}

// Messages is a list of results.
type Messages []TestResult

// Success reports whether every result succeeded.
func (m Messages) Success() bool {
	for _, r := range m {
		if !r.Success {
			return false
		}
	}
	return true
}

// NewTroubleshoot always fails in this stand-in build.
func NewTroubleshoot(envoyIP *net.IPAddr, envoyPort string) (*Troubleshoot, error) {
	return nil, errUnavailable
}

// GetUpstreams always fails in this stand-in build.
func (t *Troubleshoot) GetUpstreams() ([]string, []UpstreamIP, error) {
	return nil, nil, errUnavailable
}

// RunAllTests always fails in this stand-in build.
func (t *Troubleshoot) RunAllTests(upstreamEnvoyID, upstreamIP string) (Messages, error) {
	return nil, errUnavailable
}
