package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/weir-dev/weir"
)

// cli runs the client commands against a node's admin HTTP API.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
}

// conn is what every client command needs to reach a node.
type conn struct {
	addr, token, ca, cert, key, output string
	timeout                            time.Duration
}

// flags registers the connection flags on fs.
func (c *cli) flags(fs *flag.FlagSet, cn *conn) {
	fs.StringVar(&cn.addr, "addr", "", "the node's admin address, http(s)://host:port or host:port (default $WEIR_ADDR, else 127.0.0.1:8080)")
	fs.StringVar(&cn.token, "token", "", "bearer token for the rules API (prefer $WEIR_TOKEN: a flag shows in the process list)")
	fs.StringVar(&cn.ca, "ca", "", "PEM CA file that verifies the node's certificate (implies https)")
	fs.StringVar(&cn.cert, "cert", "", "PEM client certificate (mutual TLS; implies https)")
	fs.StringVar(&cn.key, "key", "", "PEM key of the client certificate")
	fs.StringVar(&cn.output, "o", "text", "output: text or json")
	fs.DurationVar(&cn.timeout, "timeout", 10*time.Second, "bound on the whole request")
}

// newFlags is a FlagSet for a command with its usage text.
func (c *cli) newFlags(name, synopsis string) (*flag.FlagSet, *conn) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	cn := &conn{}
	c.flags(fs, cn)
	fs.Usage = func() {
		fmt.Fprintf(c.stderr, "Usage: %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs, cn
}

// parse parses args (flags may come before or after the positional
// arguments) and returns the positional ones; code is non-negative when
// the command must return it at once.
func (c *cli) parse(fs *flag.FlagSet, cn *conn, args []string, minPos, maxPos int) (pos []string, code int) {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, 0
			}
			return nil, 2
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) < minPos || len(pos) > maxPos {
		fmt.Fprintf(c.stderr, "%s: want %d to %d arguments, got %d\n", fs.Name(), minPos, maxPos, len(pos))
		fs.Usage()
		return nil, 2
	}
	if cn.output != "text" && cn.output != "json" {
		fmt.Fprintf(c.stderr, "%s: -o: want text or json, got %q\n", fs.Name(), cn.output)
		return nil, 2
	}
	return pos, -1
}

// apiError is a non-2xx answer: the status and the server's message.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%d %s: %s", e.status, http.StatusText(e.status), e.msg)
}

// do sends one request and returns the body of a 2xx answer. Any other
// status is an *apiError with the server's message (a problem+json's
// detail and field errors, or the text it sent).
func (c *cli) do(cn *conn, method, path string, body []byte) ([]byte, error) {
	base := cn.addr
	if base == "" {
		base = c.getenv("WEIR_ADDR")
	}
	if base == "" {
		base = defaultHTTP
	}
	secure := cn.ca != "" || cn.cert != ""
	if !strings.Contains(base, "://") {
		if secure {
			base = "https://" + base
		} else {
			base = "http://" + base
		}
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("--addr: want http(s)://host:port, got %q", base)
	}
	client := &http.Client{}
	if u.Scheme == "https" {
		tc, err := clientTLS(&TLSFiles{Cert: cn.cert, Key: cn.key, CA: cn.ca})
		if err != nil {
			return nil, fmt.Errorf("TLS: %w", err)
		}
		client.Transport = &http.Transport{TLSClientConfig: tc}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cn.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(u.String(), "/")+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	token := cn.token
	if token == "" {
		token = c.getenv("WEIR_TOKEN")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, &apiError{status: resp.StatusCode, msg: problemMessage(b)}
	}
	return b, nil
}

// problemMessage is the readable part of an error body.
func problemMessage(b []byte) string {
	var p struct {
		Detail string `json:"detail"`
		Title  string `json:"title"`
		Errors []struct {
			Field   string `json:"field"`
			Message string `json:"message"`
		} `json:"errors"`
	}
	if json.Unmarshal(b, &p) == nil && (p.Detail != "" || p.Title != "") {
		msg := p.Detail
		if msg == "" {
			msg = p.Title
		}
		for _, e := range p.Errors {
			if !strings.Contains(msg, e.Message) {
				msg += "\n  " + e.Field + ": " + e.Message
			}
		}
		return msg
	}
	return strings.TrimSpace(string(b))
}

// fail reports err on stderr and returns exit code 1.
func (c *cli) fail(cmd string, err error) int {
	fmt.Fprintf(c.stderr, "%s: %v\n", cmd, err)
	return 1
}

// printJSON pretty-prints a JSON body as it came.
// fetch GETs path for the command cmd. With -o json it prints the answer
// and returns done; otherwise it decodes the answer into v. When done, code
// is the command's exit code (an error was reported, or the JSON printed).
func (c *cli) fetch(cmd string, cn *conn, path string, v any) (code int, done bool) {
	b, err := c.do(cn, http.MethodGet, path, nil)
	if err != nil {
		return c.fail(cmd, err), true
	}
	if cn.output == "json" {
		c.printJSON(b)
		return 0, true
	}
	if err := json.Unmarshal(b, v); err != nil {
		return c.fail(cmd, fmt.Errorf("unexpected answer: %w", err)), true
	}
	return 0, false
}

func (c *cli) printJSON(b []byte) {
	var buf bytes.Buffer
	if json.Indent(&buf, b, "", "  ") != nil {
		c.stdout.Write(b)
		return
	}
	buf.WriteByte('\n')
	c.stdout.Write(buf.Bytes())
}

const rulesUsage = `Usage: weir rules <get|put|delete|history> [arguments]

  weir rules get [ID]           list the rules, or show rule ID
  weir rules put ID -f FILE     create or replace rule ID (YAML or JSON; - reads stdin)
  weir rules delete ID          delete rule ID
  weir rules history            the audit history (--since, --limit)

Every subcommand takes --help. The rules API needs a lease group and a token.
`

// rules dispatches `weir rules ...`.
func (c *cli) rules(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(c.stderr, rulesUsage)
		return 2
	}
	switch args[0] {
	case "get":
		return c.rulesGet(args[1:])
	case "put":
		return c.rulesPut(args[1:])
	case "delete":
		return c.rulesDelete(args[1:])
	case "history":
		return c.rulesHistory(args[1:])
	case "help", "-h", "-help", "--help":
		fmt.Fprint(c.stdout, rulesUsage)
		return 0
	default:
		fmt.Fprintf(c.stderr, "weir rules: unknown subcommand %q\n\n%s", args[0], rulesUsage)
		return 2
	}
}

func (c *cli) rulesGet(args []string) int {
	fs, cn := c.newFlags("weir rules get", "weir rules get [ID] [flags]")
	consistent := fs.Bool("consistent", false, "read from the leader (linearizable)")
	pos, code := c.parse(fs, cn, args, 0, 1)
	if code >= 0 {
		return code
	}
	q := ""
	if *consistent {
		q = "?consistent=true"
	}
	if len(pos) == 1 {
		var r struct {
			Version uint64         `json:"version"`
			Rule    map[string]any `json:"rule"`
		}
		if code, done := c.fetch("weir rules get", cn, "/v1/rules/"+url.PathEscape(pos[0])+q, &r); done {
			return code
		}
		fmt.Fprintf(c.stdout, "# rule set version %d\n", r.Version)
		enc := yaml.NewEncoder(c.stdout)
		enc.SetIndent(2)
		_ = enc.Encode(r.Rule)
		_ = enc.Close()
		return 0
	}
	var r struct {
		Version uint64 `json:"version"`
		Rules   []struct {
			ID     string   `json:"id"`
			Limit  int64    `json:"limit"`
			Window string   `json:"window"`
			Burst  int64    `json:"burst"`
			Key    []string `json:"key"`
			Mode   string   `json:"mode"`
			Scope  string   `json:"scope"`
			Shadow bool     `json:"shadow"`
		} `json:"rules"`
	}
	if code, done := c.fetch("weir rules get", cn, "/v1/rules"+q, &r); done {
		return code
	}
	fmt.Fprintf(c.stdout, "rule set version %d, %d rules\n", r.Version, len(r.Rules))
	if len(r.Rules) == 0 {
		return 0
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tLIMIT\tWINDOW\tBURST\tKEY\tMODE\tSCOPE\tSHADOW")
	for _, x := range r.Rules {
		key := strings.Join(x.Key, ",")
		if key == "" {
			key = "global"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%s\t%v\n", x.ID, x.Limit, x.Window, x.Burst, key, x.Mode, x.Scope, x.Shadow)
	}
	tw.Flush()
	return 0
}

// ruleJSON reads a rule file (YAML or JSON: JSON is YAML) and returns it as
// the JSON the rules API takes.
func ruleJSON(name string, data []byte) ([]byte, error) {
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("%s: %v", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: want one rule, a mapping of its fields", name)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	return b, nil
}

func (c *cli) rulesPut(args []string) int {
	fs, cn := c.newFlags("weir rules put", "weir rules put ID -f FILE [flags]")
	file := fs.String("f", "", "the rule, YAML or JSON (- reads standard input); required")
	pos, code := c.parse(fs, cn, args, 1, 1)
	if code >= 0 {
		return code
	}
	if *file == "" {
		fmt.Fprintln(c.stderr, "weir rules put: -f is required")
		fs.Usage()
		return 2
	}
	var data []byte
	var err error
	if *file == "-" {
		data, err = io.ReadAll(io.LimitReader(c.stdin, 1<<20+1))
	} else {
		data, err = os.ReadFile(*file)
	}
	if err != nil {
		return c.fail("weir rules put", err)
	}
	body, err := ruleJSON(*file, data)
	if err != nil {
		return c.fail("weir rules put", err)
	}
	b, err := c.do(cn, http.MethodPut, "/v1/rules/"+url.PathEscape(pos[0]), body)
	if err != nil {
		return c.fail("weir rules put", err)
	}
	return c.printChange(cn, b, pos[0], "stored")
}

func (c *cli) rulesDelete(args []string) int {
	fs, cn := c.newFlags("weir rules delete", "weir rules delete ID [flags]")
	pos, code := c.parse(fs, cn, args, 1, 1)
	if code >= 0 {
		return code
	}
	b, err := c.do(cn, http.MethodDelete, "/v1/rules/"+url.PathEscape(pos[0]), nil)
	if err != nil {
		return c.fail("weir rules delete", err)
	}
	return c.printChange(cn, b, pos[0], "deleted")
}

// printChange prints the answer to a rule change: the JSON as it came with
// -o json, else one line with the rule set's new version.
func (c *cli) printChange(cn *conn, b []byte, id, did string) int {
	if cn.output == "json" {
		c.printJSON(b)
		return 0
	}
	var r struct {
		Version uint64 `json:"version"`
	}
	_ = json.Unmarshal(b, &r)
	fmt.Fprintf(c.stdout, "rule %s %s: rule set version %d\n", id, did, r.Version)
	return 0
}

func (c *cli) rulesHistory(args []string) int {
	fs, cn := c.newFlags("weir rules history", "weir rules history [flags]")
	since := fs.Uint64("since", 0, "entries after this version")
	limit := fs.Int("limit", 100, "at most this many entries (the server caps it at 1000)")
	if _, code := c.parse(fs, cn, args, 0, 0); code >= 0 {
		return code
	}
	var r struct {
		Version uint64 `json:"version"`
		Entries []struct {
			Version   uint64 `json:"version"`
			At        string `json:"at"`
			Principal string `json:"principal"`
			Op        string `json:"op"`
			RuleID    string `json:"rule_id"`
		} `json:"entries"`
	}
	if code, done := c.fetch("weir rules history", cn, fmt.Sprintf("/v1/rules/history?since=%d&limit=%d", *since, *limit), &r); done {
		return code
	}
	fmt.Fprintf(c.stdout, "rule set version %d, %d entries\n", r.Version, len(r.Entries))
	if len(r.Entries) == 0 {
		return 0
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tAT\tPRINCIPAL\tOP\tRULE")
	for _, e := range r.Entries {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", e.Version, e.At, e.Principal, e.Op, e.RuleID)
	}
	tw.Flush()
	return 0
}

func (c *cli) identity(args []string) int {
	fs, cn := c.newFlags("weir identity", "weir identity ID [flags]")
	method := fs.String("method", "", "keep only rules that match a request with this method (with --path)")
	path := fs.String("path", "", "keep only rules that match a request for this path")
	key := fs.String("key-source", "", "keep only rules keyed on this source (ip, user, header:NAME)")
	tier := fs.String("tier", "", "the caller's tier, for rules with tiers")
	raw := fs.Bool("raw", false, "the identity is a bucket key as Envoy's descriptors make it (\"api_key=abc\"): look it up in rules with no key chain too")
	pos, code := c.parse(fs, cn, args, 1, 1)
	if code >= 0 {
		return code
	}
	q := url.Values{}
	for k, v := range map[string]string{"method": *method, "path": *path, "key": *key, "tier": *tier} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if *raw {
		q.Set("raw", "true")
	}
	p := "/v1/identities/" + url.PathEscape(pos[0])
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var rep weir.IdentityReport
	if code, done := c.fetch("weir identity", cn, p, &rep); done {
		return code
	}
	fmt.Fprintf(c.stdout, "identity %q on %s, rule set version %d, recent counts over %s\n", rep.Identity, rep.Node, rep.RulesVersion, rep.RecentSince)
	if len(rep.Throttled) > 0 {
		fmt.Fprintf(c.stdout, "throttled by: %s\n", strings.Join(rep.Throttled, ", "))
	} else {
		fmt.Fprintln(c.stdout, "throttled by: none")
	}
	if len(rep.Rules) == 0 {
		fmt.Fprintln(c.stdout, "no rule applies")
		return 0
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tLIMIT\tDECIDED BY\tREMAINING\tBURST\tDEBT\tRECENT OK/REJ\tVERDICT")
	for _, r := range rep.Rules {
		where := r.Bucket.Where
		if r.Bucket.Node != "" {
			where += " " + r.Bucket.Node
		}
		rem := fmt.Sprint(r.Bucket.Remaining)
		if !r.Bucket.Known {
			rem = "?"
			if r.Bucket.Error != "" {
				rem = "? (" + r.Bucket.Error + ")"
			}
		}
		fmt.Fprintf(tw, "%s\t%d/%s\t%s\t%s\t%d\t%d\t%d/%d\t%s\n", r.Rule, r.Limit, r.Window, where, rem, r.Bucket.Burst,
			r.Bucket.Debt, r.Allowed, r.Rejected, r.Verdict)
	}
	tw.Flush()
	return 0
}

func (c *cli) status(args []string) int {
	fs, cn := c.newFlags("weir status", "weir status [flags]")
	if _, code := c.parse(fs, cn, args, 0, 0); code >= 0 {
		return code
	}
	var ov weir.Overview
	if code, done := c.fetch("weir status", cn, "/v1/status", &ov); done {
		return code
	}
	region := ov.Region
	if region == "" {
		region = "(none)"
	}
	fmt.Fprintf(c.stdout, "node %s, region %s", ov.Node, region)
	if !ov.Cluster {
		fmt.Fprint(c.stdout, ", no cluster")
	}
	fmt.Fprintln(c.stdout)
	fmt.Fprintf(c.stdout, "rules: version %d (%s), %d rules", ov.Status.RulesVersion, short(ov.Status.RulesDigest), len(ov.Rules))
	if ov.Behind > 0 {
		fmt.Fprintf(c.stdout, ", %d versions behind", ov.Behind)
	}
	if ov.Status.UsingDefaultRules {
		fmt.Fprint(c.stdout, ", ENFORCING DEFAULT RULES")
	}
	fmt.Fprintln(c.stdout)
	if ov.Status.LastReloadError != "" {
		fmt.Fprintf(c.stdout, "last reload error: %s\n", ov.Status.LastReloadError)
	}
	var degraded uint64
	for _, k := range ov.Counts {
		degraded += k.FailOpen
	}
	fmt.Fprintf(c.stdout, "members: %d, degraded decisions: %d", len(ov.Members), degraded)
	if ov.Canary.Enabled {
		fmt.Fprintf(c.stdout, ", canary ok: %v", ov.Canary.OK)
	}
	fmt.Fprintln(c.stdout)
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nMEMBER\tREGION\tHEALTH\tRULES\tRING SHARE")
	for _, m := range ov.Members {
		share := "-"
		if m.InRing {
			share = fmt.Sprintf("%.1f%%", 100*m.RingShare)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", m.Name, m.Region, m.Health, m.RulesVersion, share)
	}
	if len(ov.Counts) > 0 {
		fmt.Fprintln(tw, "\nRULE\tALLOWED\tREJECTED\tSHADOW REJ\tDEGRADED")
		for _, k := range ov.Counts {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", k.Rule, k.Allowed, k.Rejected, k.ShadowRejected, k.FailOpen)
		}
	}
	tw.Flush()
	return 0
}

func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}
