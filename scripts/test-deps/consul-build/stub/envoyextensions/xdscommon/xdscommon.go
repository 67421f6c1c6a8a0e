// Package xdscommon is a stand-in written for dlock's test build of Consul
// v1.16.0 (see extensioncommon's doc): the xDS type URLs, resource indexing and
// Envoy version helpers the agent compiles against.
package xdscommon

import (
	"fmt"

	envoy_cluster_v3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	envoy_core_v3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	envoy_endpoint_v3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	envoy_listener_v3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	envoy_route_v3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	envoy_tls_v3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-version"
	"google.golang.org/protobuf/proto"
)

const (
	apiTypePrefix = "type.googleapis.com/"

	ListenerType = apiTypePrefix + "envoy.config.listener.v3.Listener"
	RouteType    = apiTypePrefix + "envoy.config.route.v3.RouteConfiguration"
	ClusterType  = apiTypePrefix + "envoy.config.cluster.v3.Cluster"
	EndpointType = apiTypePrefix + "envoy.config.endpoint.v3.ClusterLoadAssignment"
	SecretType   = apiTypePrefix + "envoy.extensions.transport_sockets.tls.v3.Secret"

	LocalAppClusterName       = "local_app"
	PublicListenerName        = "public_listener"
	OutboundListenerName      = "outbound_listener"
	FailoverClusterNamePrefix = "failover-target~"
)

// EnvoyVersions lists the Envoy versions this build reports as supported, newest first.
var EnvoyVersions = []string{"1.26.2", "1.25.7", "1.24.8", "1.23.10"}

// UnsupportedEnvoyVersions lists Envoy versions known not to work.
var UnsupportedEnvoyVersions = []string{}

// GetMaxEnvoyMinorVersion returns the newest supported minor version, e.g. "1.26".
func GetMaxEnvoyMinorVersion() string { return minor(EnvoyVersions[0]) }

// GetMinEnvoyMinorVersion returns the oldest supported minor version.
func GetMinEnvoyMinorVersion() string { return minor(EnvoyVersions[len(EnvoyVersions)-1]) }

func minor(v string) string {
	sv, err := version.NewVersion(v)
	if err != nil {
		return v
	}
	s := sv.Segments()
	return fmt.Sprintf("%d.%d", s[0], s[1])
}

// IndexedResources indexes xDS resources by type URL and name.
type IndexedResources struct {
	Index      map[string]map[string]proto.Message
	ChildIndex map[string]map[string][]string
}

// EmptyIndexedResources returns an index with every type present and empty.
func EmptyIndexedResources() *IndexedResources {
	return &IndexedResources{
		Index: map[string]map[string]proto.Message{
			ListenerType: {}, RouteType: {}, ClusterType: {}, EndpointType: {}, SecretType: {},
		},
		ChildIndex: map[string]map[string][]string{
			ListenerType: {}, ClusterType: {},
		},
	}
}

// IndexResources indexes resources by type URL and name.
func IndexResources(logger hclog.Logger, resources map[string][]proto.Message) *IndexedResources {
	data := EmptyIndexedResources()
	for typeURL, typeRes := range resources {
		for _, res := range typeRes {
			name := GetResourceName(res)
			if name == "" {
				logger.Warn("skipping unexpected xDS type found in resource map", "typeURL", typeURL)
				continue
			}
			if data.Index[typeURL] == nil {
				data.Index[typeURL] = map[string]proto.Message{}
			}
			data.Index[typeURL][name] = res
		}
	}
	return data
}

// GetResourceName returns a resource's name, or "" for an unknown type.
func GetResourceName(res proto.Message) string {
	switch x := res.(type) {
	case *envoy_listener_v3.Listener:
		return x.Name
	case *envoy_route_v3.RouteConfiguration:
		return x.Name
	case *envoy_cluster_v3.Cluster:
		return x.Name
	case *envoy_endpoint_v3.ClusterLoadAssignment:
		return x.ClusterName
	case *envoy_tls_v3.Secret:
		return x.Name
	default:
		return ""
	}
}

// SupportedProxyFeatures holds feature flags derived from the Envoy version.
type SupportedProxyFeatures struct{}

// DetermineSupportedProxyFeatures returns the features of the node's Envoy.
func DetermineSupportedProxyFeatures(node *envoy_core_v3.Node) (SupportedProxyFeatures, error) {
	return SupportedProxyFeatures{}, nil
}

// DetermineEnvoyVersionFromNode returns the node's Envoy version, or nil.
func DetermineEnvoyVersionFromNode(node *envoy_core_v3.Node) *version.Version {
	if node == nil {
		return nil
	}
	bv := node.GetUserAgentBuildVersion()
	if bv == nil || bv.Version == nil {
		return nil
	}
	v := bv.Version
	return version.Must(version.NewVersion(fmt.Sprintf("%d.%d.%d", v.MajorNumber, v.MinorNumber, v.Patch)))
}
