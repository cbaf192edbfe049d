// Package leasepb is the generated protobuf code of the lease group's
// replicated log (lease.proto, package weir.lease.v1): the commands of its
// entries, messages only. The LeaseGroup service that forwards them to the
// leader is lease/raftgroup/grouppb, in the same protobuf package. It is
// committed; regenerate it with scripts/gen-proto.sh. Use it through
// package lease: the conversion to and from lease.Command, with
// validation, is lease/codec.go.
package leasepb
