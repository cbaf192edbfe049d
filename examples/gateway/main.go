// Command gateway is the smallest useful weir gateway: an HTTP server that
// rate-limits an upstream handler by API key with the rules in rules.yaml,
// which it reloads when the file changes. On SIGINT or SIGTERM it stops
// taking requests, lets those in flight finish, and closes the node (in a
// cluster, Close hands the node's buckets to their next owners).
// docs/getting-started.md walks through it.
//
//	go run ./examples/gateway [-addr 127.0.0.1:8080] [-rules examples/gateway/rules.yaml]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "where the gateway listens")
	rules := flag.String("rules", "examples/gateway/rules.yaml", "the rule file (watched: valid changes apply within a second)")
	flag.Parse()

	node, err := weir.New(weir.Config{RulesFile: *rules})
	if err != nil {
		log.Fatal(err)
	}

	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the upstream: %s %s\n", r.Method, r.URL.Path)
	})
	mux := http.NewServeMux()
	mux.Handle("/", node.Middleware(upstream))                         // every request goes through weir
	mux.Handle("/ops/", http.StripPrefix("/ops", ops.UIHandler(node))) // the status page: operators only
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Printf("gateway on http://%s (status page http://%s/ops/)", *addr, *addr)
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	select {
	case err := <-served: // the address is taken, say
		node.Close()
		log.Fatal(err)
	case <-ctx.Done():
	}
	stop() // a second signal ends the process at once

	// Stop taking requests and let those in flight finish, then close
	// the node.
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		log.Print(err)
	}
	if err := node.Close(); err != nil {
		log.Fatal(err)
	}
	log.Print("gateway stopped")
}
