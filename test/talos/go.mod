module github.com/steward-trustd/steward-trustd/test/talos

go 1.26.8

replace github.com/steward-trustd/steward-trustd => ../..

require (
	github.com/google/go-tpm v0.9.8
	github.com/siderolabs/crypto v0.6.5
	github.com/siderolabs/talos v1.14.1
	github.com/siderolabs/talos/pkg/machinery v1.14.1
	github.com/steward-trustd/steward-trustd v0.0.0-00010101000000-000000000000
	go.yaml.in/yaml/v4 v4.0.0-rc.6
	golang.org/x/net v0.60.0
	golang.org/x/sys v0.48.0
	google.golang.org/grpc v1.85.0
)

require (
	github.com/containerd/go-cni v1.1.13 // indirect
	github.com/containernetworking/cni v1.3.0 // indirect
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/google/go-tpm-tools v0.4.10 // indirect
	github.com/pelletier/go-toml v1.9.5 // indirect
	github.com/petermattis/goid v0.0.0-20260713124913-97594f28f5ca // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20260702190614-8ae5a48058df // indirect
	github.com/sasha-s/go-deadlock v0.3.9 // indirect
	github.com/siderolabs/gen v0.8.8 // indirect
	github.com/siderolabs/go-retry v0.3.3 // indirect
	github.com/weppos/publicsuffix-go v0.50.4-0.20260821095816-b0fdb5c2d345 // indirect
	github.com/zmap/zcrypto v0.0.0-20260906180147-3ed30b1e9340 // indirect
	github.com/zmap/zlint/v3 v3.7.3 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
