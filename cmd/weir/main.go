// Command weir is the weir daemon and its command-line client.
//
//	weir serve --config weir.yaml        run one node (docs/weir.md)
//	weir rules get [ID]                  the rule set, or one rule
//	weir rules put ID -f rule.yaml       create or replace a rule
//	weir rules delete ID                 delete a rule
//	weir rules history                   the rules' audit history
//	weir identity ID                     why an identity is (not) throttled
//	weir status                          a node's members, rules and counts
//
// The client commands talk to a node's admin HTTP API: --addr (or
// WEIR_ADDR), a bearer token in WEIR_TOKEN (or --token), and --ca, --cert,
// --key for HTTPS. `-o json` prints the server's JSON for scripts. Every
// command takes --help.
package main

import (
	"fmt"
	"io"
	"os"
)

const usage = `Usage: weir <command> [arguments]

Commands:
  serve              run one weir node (the daemon)
  rules get [ID]     list the rules, or show one
  rules put ID -f F  create or replace rule ID from F (YAML or JSON; - for stdin)
  rules delete ID    delete rule ID
  rules history      the audit history of rule changes
  identity ID        the state of an identity's buckets, rule by rule
  status             the node's members, rules and decision counts

Run 'weir <command> --help' for a command's flags. The client commands read
WEIR_ADDR (the node's admin address) and WEIR_TOKEN (the bearer token).
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv))
}

// run dispatches a command line and returns the exit code: 0 done, 1
// failed (the server refused, a connection failed, a bad config), 2 bad
// usage.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cl := &cli{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv}
	switch args[0] {
	case "serve":
		return cmdServe(args[1:], stdout, stderr)
	case "rules":
		return cl.rules(args[1:])
	case "identity":
		return cl.identity(args[1:])
	case "status":
		return cl.status(args[1:])
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "weir: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}
