// Package extensioncommon is a stand-in written for dlock's test build of
// Consul v1.16.0. The published module github.com/hashicorp/consul/envoyextensions
// is not served to this build, so this package provides only the API surface the
// Consul v1.16.0 agent compiles against. Envoy extensions (Lua, Wasm, ext-authz,
// AWS Lambda, rate limit, property override) are NOT functional in a binary built
// with it: extending xDS resources returns an error. The KV store, sessions and
// Raft are unaffected: they do not use this package.
package extensioncommon

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	envoy_cluster_v3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	envoy_core_v3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	envoy_endpoint_v3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	envoy_listener_v3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	envoy_route_v3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	envoy_http_v3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	envoy_tls_v3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/consul/envoyextensions/xdscommon"
)

// ErrUnavailable is returned by every extender of this stand-in build.
var ErrUnavailable = errors.New("envoy extensions are not available in this test build of consul")

// UpstreamData describes an upstream of the local proxy.
type UpstreamData struct {
	PrimarySNI        string
	SNIs              map[string]struct{}
	VIP               string
	EnvoyID           string
	OutgoingProxyKind api.ServiceKind
}

// RuntimeConfig is the runtime data an extension is applied with.
type RuntimeConfig struct {
	EnvoyExtension        api.EnvoyExtension
	ServiceName           api.CompoundServiceName
	Upstreams             map[api.CompoundServiceName]*UpstreamData
	IsSourcedFromUpstream bool
	Kind                  api.ServiceKind
	Protocol              string
}

// UpstreamOutgoingProxyKind returns the proxy kind of the upstream the extension names.
func (c RuntimeConfig) UpstreamOutgoingProxyKind() api.ServiceKind {
	if u, ok := c.Upstreams[c.ServiceName]; ok {
		return u.OutgoingProxyKind
	}
	return api.ServiceKindConnectProxy
}

// EnvoyExtender validates and applies an extension.
type EnvoyExtender interface {
	Validate(*RuntimeConfig) error
	Extend(*xdscommon.IndexedResources, *RuntimeConfig) (*xdscommon.IndexedResources, error)
}

// TrafficDirection is inbound or outbound.
type TrafficDirection string

const (
	TrafficDirectionInbound  TrafficDirection = "inbound"
	TrafficDirectionOutbound TrafficDirection = "outbound"
)

// TrafficDirections holds the valid directions.
var TrafficDirections = StringSet{string(TrafficDirectionInbound): {}, string(TrafficDirectionOutbound): {}}

// StringSet is a set of strings.
type StringSet map[string]struct{}

// CheckRequired reports an error when v is empty or not in the set.
func (s StringSet) CheckRequired(v, name string) error {
	if v == "" {
		return fmt.Errorf("field %s is required", name)
	}
	if _, ok := s[v]; !ok {
		keys := make([]string, 0, len(s))
		for k := range s {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return fmt.Errorf("invalid %s %q; supported values: %s", name, v, strings.Join(keys, ", "))
	}
	return nil
}

// NormalizeServiceName fills the default namespace and partition.
func NormalizeServiceName(sn *api.CompoundServiceName) {
	if sn.Namespace == "" {
		sn.Namespace = "default"
	}
	if sn.Partition == "" {
		sn.Partition = "default"
	}
}

// Payload is one resource handed to a BasicExtension.
type Payload[K proto.Message] struct {
	TrafficDirection TrafficDirection
	ServiceName      *api.CompoundServiceName
	Name             string
	Message          K
	RuntimeConfig    *RuntimeConfig
}

// IsInbound reports whether the payload is for an inbound resource.
func (p Payload[K]) IsInbound() bool { return p.TrafficDirection == TrafficDirectionInbound }

type (
	RoutePayload                 = Payload[*envoy_route_v3.RouteConfiguration]
	ClusterPayload               = Payload[*envoy_cluster_v3.Cluster]
	ClusterLoadAssignmentPayload = Payload[*envoy_endpoint_v3.ClusterLoadAssignment]
	ListenerPayload              = Payload[*envoy_listener_v3.Listener]
	FilterPayload                = Payload[*envoy_listener_v3.Filter]
)

// ClusterMap maps cluster names to clusters.
type ClusterMap map[string]*envoy_cluster_v3.Cluster

// RouteMap maps route names to routes.
type RouteMap map[string]*envoy_route_v3.RouteConfiguration

// ListenerMap maps listener names to listeners.
type ListenerMap map[string]*envoy_listener_v3.Listener

// BasicExtension is the extension shape the builtins implement.
type BasicExtension interface {
	CanApply(*RuntimeConfig) bool
	PatchRoute(RoutePayload) (*envoy_route_v3.RouteConfiguration, bool, error)
	PatchRoutes(*RuntimeConfig, RouteMap) (RouteMap, error)
	PatchCluster(ClusterPayload) (*envoy_cluster_v3.Cluster, bool, error)
	PatchClusters(*RuntimeConfig, ClusterMap) (ClusterMap, error)
	PatchClusterLoadAssignment(ClusterLoadAssignmentPayload) (*envoy_endpoint_v3.ClusterLoadAssignment, bool, error)
	PatchListener(ListenerPayload) (*envoy_listener_v3.Listener, bool, error)
	PatchListeners(*RuntimeConfig, ListenerMap) (ListenerMap, error)
	PatchFilter(FilterPayload) (*envoy_listener_v3.Filter, bool, error)
	PatchFilters(*RuntimeConfig, []*envoy_listener_v3.Filter, bool) ([]*envoy_listener_v3.Filter, error)
}

// BasicExtensionAdapter gives every BasicExtension method a no-op default.
type BasicExtensionAdapter struct{}

func (BasicExtensionAdapter) CanApply(*RuntimeConfig) bool { return false }
func (BasicExtensionAdapter) PatchRoute(p RoutePayload) (*envoy_route_v3.RouteConfiguration, bool, error) {
	return p.Message, false, nil
}
func (BasicExtensionAdapter) PatchRoutes(_ *RuntimeConfig, m RouteMap) (RouteMap, error) {
	return m, nil
}
func (BasicExtensionAdapter) PatchCluster(p ClusterPayload) (*envoy_cluster_v3.Cluster, bool, error) {
	return p.Message, false, nil
}
func (BasicExtensionAdapter) PatchClusters(_ *RuntimeConfig, m ClusterMap) (ClusterMap, error) {
	return m, nil
}
func (BasicExtensionAdapter) PatchClusterLoadAssignment(p ClusterLoadAssignmentPayload) (*envoy_endpoint_v3.ClusterLoadAssignment, bool, error) {
	return p.Message, false, nil
}
func (BasicExtensionAdapter) PatchListener(p ListenerPayload) (*envoy_listener_v3.Listener, bool, error) {
	return p.Message, false, nil
}
func (BasicExtensionAdapter) PatchListeners(_ *RuntimeConfig, m ListenerMap) (ListenerMap, error) {
	return m, nil
}
func (BasicExtensionAdapter) PatchFilter(p FilterPayload) (*envoy_listener_v3.Filter, bool, error) {
	return p.Message, false, nil
}
func (BasicExtensionAdapter) PatchFilters(_ *RuntimeConfig, f []*envoy_listener_v3.Filter, _ bool) ([]*envoy_listener_v3.Filter, error) {
	return f, nil
}

// BasicEnvoyExtender applies a BasicExtension to the local proxy's resources.
type BasicEnvoyExtender struct {
	Extension BasicExtension
}

// Validate always fails in this stand-in build.
func (b *BasicEnvoyExtender) Validate(*RuntimeConfig) error { return ErrUnavailable }

// Extend always fails in this stand-in build.
func (b *BasicEnvoyExtender) Extend(r *xdscommon.IndexedResources, _ *RuntimeConfig) (*xdscommon.IndexedResources, error) {
	return r, ErrUnavailable
}

// UpstreamEnvoyExtender applies a BasicExtension to an upstream's resources.
type UpstreamEnvoyExtender struct {
	Extension BasicExtension
}

// Validate always fails in this stand-in build.
func (u *UpstreamEnvoyExtender) Validate(*RuntimeConfig) error { return ErrUnavailable }

// Extend always fails in this stand-in build.
func (u *UpstreamEnvoyExtender) Extend(r *xdscommon.IndexedResources, _ *RuntimeConfig) (*xdscommon.IndexedResources, error) {
	return r, ErrUnavailable
}

// InsertLocation says where a filter is inserted.
type InsertLocation string

const (
	InsertFirst            InsertLocation = "First"
	InsertBeforeFirstMatch InsertLocation = "BeforeFirstMatch"
	InsertAfterFirstMatch  InsertLocation = "AfterFirstMatch"
	InsertBeforeLastMatch  InsertLocation = "BeforeLastMatch"
	InsertAfterLastMatch   InsertLocation = "AfterLastMatch"
	InsertLast             InsertLocation = "Last"
)

// InsertOptions says where a filter is inserted.
type InsertOptions struct {
	Location   InsertLocation
	FilterName string
}

// InsertHTTPFilter always fails in this stand-in build.
func InsertHTTPFilter(f []*envoy_listener_v3.Filter, _ *envoy_http_v3.HttpFilter, _ InsertOptions) ([]*envoy_listener_v3.Filter, error) {
	return f, ErrUnavailable
}

// InsertNetworkFilter always fails in this stand-in build.
func InsertNetworkFilter(f []*envoy_listener_v3.Filter, _ *envoy_listener_v3.Filter, _ InsertOptions) ([]*envoy_listener_v3.Filter, error) {
	return f, ErrUnavailable
}

// MakeFilter wraps cfg as a typed network filter.
func MakeFilter(name string, cfg proto.Message) (*envoy_listener_v3.Filter, error) {
	a, err := anypb.New(cfg)
	if err != nil {
		return nil, err
	}
	return &envoy_listener_v3.Filter{Name: name, ConfigType: &envoy_listener_v3.Filter_TypedConfig{TypedConfig: a}}, nil
}

// MakeEnvoyHTTPFilter wraps cfg as a typed HTTP filter.
func MakeEnvoyHTTPFilter(name string, cfg proto.Message) (*envoy_http_v3.HttpFilter, error) {
	a, err := anypb.New(cfg)
	if err != nil {
		return nil, err
	}
	return &envoy_http_v3.HttpFilter{Name: name, ConfigType: &envoy_http_v3.HttpFilter_TypedConfig{TypedConfig: a}}, nil
}

// MakeUpstreamTLSTransportSocket wraps tlsContext as a TLS transport socket.
func MakeUpstreamTLSTransportSocket(tlsContext *envoy_tls_v3.UpstreamTlsContext) (*envoy_core_v3.TransportSocket, error) {
	a, err := anypb.New(tlsContext)
	if err != nil {
		return nil, err
	}
	return &envoy_core_v3.TransportSocket{Name: "tls", ConfigType: &envoy_core_v3.TransportSocket_TypedConfig{TypedConfig: a}}, nil
}
