#!/usr/bin/env bash
# Regenerates cluster/peerpb from cluster/peerpb/peer.proto, lease/leasepb
# from lease/leasepb/lease.proto (the log's commands, messages only) and
# lease/raftgroup/grouppb from its group.proto (the forwarding service, which
# imports lease.proto). The generated code is committed: the normal
# build and `go test ./...` need no protoc.
#
# The plugins are installed with pinned versions into a temporary GOBIN, so
# no tool requirement enters the library's go.mod (DESIGN.md, "Practical
# notes"). protoc comes from Debian when it is missing.
#
#   scripts/gen-proto.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Keep protoc-gen-go equal to the google.golang.org/protobuf in go.mod.
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

if ! command -v protoc >/dev/null 2>&1; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "protoc is missing: install the Debian package protobuf-compiler" >&2
		exit 1
	fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler
fi

gobin="$(mktemp -d)"
trap 'rm -rf "$gobin"' EXIT
# Installing from outside the module keeps go.mod and go.sum untouched.
(cd "$gobin" &&
	GOBIN="$gobin" GOFLAGS= go install "google.golang.org/protobuf/cmd/protoc-gen-go@${PROTOC_GEN_GO_VERSION}" &&
	GOBIN="$gobin" GOFLAGS= go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}")

# gen DIR FILE [IMPORTDIR]: regenerates DIR from DIR/FILE, finding the files
# it imports in IMPORTDIR.
gen() {
	PATH="$gobin:$PATH" protoc \
		--proto_path="$1" ${3:+--proto_path="$3"} \
		--go_out="$1" --go_opt=paths=source_relative \
		--go-grpc_out="$1" --go-grpc_opt=paths=source_relative \
		"$2"
}
gen cluster/peerpb peer.proto
gen lease/leasepb lease.proto
gen lease/raftgroup/grouppb group.proto lease/leasepb

echo "regenerated cluster/peerpb, lease/leasepb and lease/raftgroup/grouppb ($(protoc --version), protoc-gen-go ${PROTOC_GEN_GO_VERSION}, protoc-gen-go-grpc ${PROTOC_GEN_GO_GRPC_VERSION})"
