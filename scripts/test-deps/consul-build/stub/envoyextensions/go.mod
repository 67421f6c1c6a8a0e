module github.com/hashicorp/consul/envoyextensions

go 1.20

require (
	github.com/envoyproxy/go-control-plane v0.11.0
	github.com/hashicorp/consul/api v1.22.0
	github.com/hashicorp/go-hclog v1.5.0
	github.com/hashicorp/go-version v1.2.1
	google.golang.org/protobuf v1.30.0
)
