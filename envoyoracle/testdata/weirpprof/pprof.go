// This file is added to cmd/weir at build time by the side-by-side
// measurement (go build -overlay; see sideproc_test.go), never to the
// repository's command: with WEIR_PPROF_LISTEN set to a loopback host:port,
// `weir serve` serves its CPU profile there at /debug/pprof/profile.
package main

import (
	"net"
	"net/http"
	"net/http/pprof"
	"os"
)

func init() {
	addr := os.Getenv("WEIR_PPROF_LISTEN")
	if addr == "" {
		return
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	go http.Serve(ln, mux)
}
