// Package grouppb is the generated protobuf and gRPC code of the lease
// group's forwarding service (group.proto, package weir.lease.v1, which
// imports the log's commands from lease/leasepb): the LeaseGroup service
// through which a follower's write reaches the leader and a client that is
// not a voter reports, decides durable requests and reads and changes the
// rule store. It is committed; regenerate it with scripts/gen-proto.sh. Use
// it through package raftgroup, which converts and validates.
package grouppb
