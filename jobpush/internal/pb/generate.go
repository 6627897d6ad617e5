// Package pb holds the protobuf messages and gRPC service of Berth's job
// push channel, generated from jobpush.proto (the protocol's
// specification).
//
// Regenerate with `go generate ./jobpush/internal/pb` (needs protoc from
// Debian's protobuf-compiler, plus protoc-gen-go and protoc-gen-go-grpc:
// go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
// google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2).
package pb

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative jobpush.proto jobrouter.proto
