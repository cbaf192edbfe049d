// Command gateway is the smallest useful weir gateway: an HTTP server that
// rate-limits an upstream handler by API key with the rules in rules.yaml,
// which it reloads when the file changes. docs/getting-started.md walks
// through it.
//
//	go run ./examples/gateway [-addr 127.0.0.1:8080] [-rules examples/gateway/rules.yaml]
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"

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
	defer node.Close()

	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the upstream: %s %s\n", r.Method, r.URL.Path)
	})
	mux := http.NewServeMux()
	mux.Handle("/", node.Middleware(upstream))                         // every request goes through weir
	mux.Handle("/ops/", http.StripPrefix("/ops", ops.UIHandler(node))) // the status page: operators only
	log.Printf("gateway on http://%s (status page http://%s/ops/)", *addr, *addr)
	log.Fatal(http.ListenAndServe(*addr, mux))
}
