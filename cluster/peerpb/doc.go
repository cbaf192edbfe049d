// Package peerpb is the generated protobuf and gRPC code of weir's peer
// protocol (peer.proto, package weir.peer.v1). It is committed; regenerate it
// with scripts/gen-proto.sh. Use it through cluster's transport: the
// conversion to and from cluster.Message, with validation, is cluster/shell/wire.go.
package peerpb
