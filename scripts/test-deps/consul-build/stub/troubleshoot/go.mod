module github.com/hashicorp/consul/troubleshoot

go 1.20
