// Package leasepb is the generated protobuf and gRPC code of the lease
// group's protocol (lease.proto, package weir.lease.v1): the commands of the
// replicated log and the LeaseGroup service that forwards a follower's write
// to the leader. It is committed; regenerate it with scripts/gen-proto.sh.
// Use it through package lease: the conversion to and from lease.Command,
// with validation, is lease/codec.go.
package leasepb
