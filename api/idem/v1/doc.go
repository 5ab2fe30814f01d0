// Package idemv1 holds the generated protobuf and gRPC code of idem's public
// API (package idem.v1), and what every program that speaks it shares: the
// conversions of error codes, statuses, reserve outcomes and times
// (convert.go), the forwarding metadata (metadata.go), the Batch RPC's
// helpers (batch.go) and the Routing answer (routing.go). It imports no
// state machine: the conversions to fsm types are internal/wire's. The
// generated files are committed so that neither CI
// nor users need protoc; regenerate after editing idem.proto with
//
//	go generate ./api/...
//
// which needs protoc, protoc-gen-go v1.36.x and protoc-gen-go-grpc v1.6.x on PATH.
package idemv1

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative idem.proto
//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative topology.proto
