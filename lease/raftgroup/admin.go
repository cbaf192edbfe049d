package raftgroup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"golang.org/x/time/rate"

	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/quota"
)

// This file is the admin HTTP API over a RuleService (docs/rules-api.md):
//
//	PUT    /v1/rules/{id}      create or replace a rule (JSON body)
//	GET    /v1/rules           the rule set and its version
//	GET    /v1/rules/{id}      one rule
//	DELETE /v1/rules/{id}      delete a rule
//	GET    /v1/rules/history   the audit history (?since=N&limit=M)
//
// GETs take ?consistent=true for a linearizable read (the leader's view).
// /v1/rules/history is the history, so a rule named "history" can be read
// only in the list (and PUT and DELETE on that path answer 405).
//
// Every request must authenticate, with a bearer token from
// AdminConfig.Tokens or a verified client certificate (the principal is
// its subject's common name); otherwise it gets 401 with WWW-Authenticate,
// nothing changes, and the attempt is logged (at most a few lines a
// second). Errors are application/problem+json (RFC 9457) naming the field.
//
// A rule's JSON uses the rules file's field names and forms (docs/rules.md):
// {"limit": 100, "window": "1m", "burst": 20, "scope": "global",
// "cost_by_method": {"POST": 5}, "key": ["header:X-Api-Key"]}. The body is
// read by quota's own parser, so a field means exactly what it means in a
// rules file, and an unknown field, a duration without a unit or a zero
// written for "the default" is refused with the field's path. The body's
// "id" may be left out; if present it must equal the path's. Responses
// carry rules in the same form, normalised (every default written out), so
// a rule read with GET can be PUT back unchanged.

// Defaults of AdminConfig.
const (
	// DefaultAdminMaxBody is the largest PUT body accepted (1 MiB).
	DefaultAdminMaxBody = 1 << 20
	// DefaultAdminTimeout bounds a request's call to the store.
	DefaultAdminTimeout = 10 * time.Second
	// MinAdminTokenBytes is the shortest bearer token AdminConfig accepts.
	MinAdminTokenBytes = 16
	// maxBodyDepth bounds the nesting of a PUT body.
	maxBodyDepth = 16
)

// AdminConfig configures AdminHandler. Store is required; the zero value
// of every other field works (with no Tokens, only client certificates
// authenticate).
type AdminConfig struct {
	// Store is the rule store served: a *Group on a voter, a *Client
	// elsewhere.
	Store RuleService
	// Tokens maps each accepted bearer token to the principal it
	// authenticates (recorded in the audit history). Tokens are compared
	// in constant time; each must be at least MinAdminTokenBytes long.
	Tokens map[string]string
	// Logger receives refused authentications (rate limited) and accepted
	// changes; nil discards them.
	Logger *slog.Logger
	// MaxBodyBytes is the largest PUT body; 0 means DefaultAdminMaxBody.
	MaxBodyBytes int64
	// Timeout bounds each request's call to the store; 0 means
	// DefaultAdminTimeout.
	Timeout time.Duration
	// Linearizable makes every GET a linearizable read, as if it asked
	// ?consistent=true.
	Linearizable bool
}

// Admin is the admin HTTP API: an http.Handler. Serve it over TLS; for
// client certificates, set the server's tls.Config ClientAuth to
// tls.VerifyClientCertIfGiven (tokens and certificates) or
// tls.RequireAndVerifyClientCert (certificates only), with ClientCAs.
type Admin struct {
	cfg   AdminConfig
	log   *slog.Logger
	guard *Guard
}

// GuardConfig configures NewGuard. The zero value works: with no Tokens,
// only verified client certificates authenticate.
type GuardConfig struct {
	// Tokens maps each accepted bearer token to the principal it
	// authenticates. Tokens are compared in constant time (as SHA-256
	// sums, every one compared); each must be at least MinAdminTokenBytes
	// long.
	Tokens map[string]string
	// Logger receives refused attempts at warn level (method, path and
	// remote address, never the token; at most a few lines a second, the
	// next line saying how many went unlogged); nil discards them.
	Logger *slog.Logger
	// Realm is the realm of the WWW-Authenticate challenge; "" means
	// "weir-admin".
	Realm string
}

// Guard is the door of the admin APIs: a request must carry a valid bearer
// token (when it has an Authorization header, that header alone decides)
// or else a verified client certificate, whose subject common name is
// then the principal. Anything else is answered 401 with
// WWW-Authenticate, logged and counted, and never reaches the handler.
// A Guard is safe for concurrent use.
type Guard struct {
	log     *slog.Logger
	realm   string
	tokens  []adminToken
	logLim  *rate.Limiter
	refused atomic.Uint64
	muted   atomic.Uint64 // refusals not logged since the last line
}

// NewGuard returns a Guard. It fails, naming the field, on an empty
// principal or a short token.
func NewGuard(cfg GuardConfig) (*Guard, error) {
	g := &Guard{log: cfg.Logger, realm: cfg.Realm, logLim: rate.NewLimiter(rate.Every(time.Second), 5)}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.realm == "" {
		g.realm = "weir-admin"
	}
	for tok, principal := range cfg.Tokens {
		switch {
		case principal == "":
			return nil, errors.New("lease: AdminConfig.Tokens: a token with an empty principal")
		case len(tok) < MinAdminTokenBytes:
			return nil, fmt.Errorf("lease: AdminConfig.Tokens: the token of %q is shorter than %d bytes", principal, MinAdminTokenBytes)
		}
		if err := (lease.RuleChange{Principal: principal, Delete: "x"}).Check(); err != nil {
			return nil, fmt.Errorf("lease: AdminConfig.Tokens: principal %q: %w", principal, err)
		}
		g.tokens = append(g.tokens, adminToken{sum: sha256.Sum256([]byte(tok)), principal: principal})
	}
	// A fixed order, so that the time a comparison takes does not depend
	// on the map's.
	slices.SortFunc(g.tokens, func(x, y adminToken) int { return bytes.Compare(x.sum[:], y.sum[:]) })
	return g, nil
}

// Wrap returns h behind the guard.
func (g *Guard) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := g.Authenticate(r); !ok {
			w.Header().Set("Cache-Control", "no-store")
			g.unauthorized(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Unauthorized is the number of requests refused for want of valid
// credentials.
func (g *Guard) Unauthorized() uint64 { return g.refused.Load() }

type adminToken struct {
	sum       [sha256.Size]byte
	principal string
}

// AdminHandler returns the admin API over cfg.Store. It fails, naming the
// field, on a nil Store, an empty principal or a short token.
func AdminHandler(cfg AdminConfig) (*Admin, error) {
	if cfg.Store == nil {
		return nil, errors.New("lease: AdminConfig.Store is nil")
	}
	if cfg.MaxBodyBytes < 0 || cfg.Timeout < 0 {
		return nil, errors.New("lease: AdminConfig.MaxBodyBytes and Timeout must not be negative")
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultAdminMaxBody
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultAdminTimeout
	}
	a := &Admin{cfg: cfg, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	a.log = a.log.With("component", "rules-admin")
	g, err := NewGuard(GuardConfig{Tokens: cfg.Tokens, Logger: a.log, Realm: "weir-rules"})
	if err != nil {
		return nil, err
	}
	a.guard = g
	return a, nil
}

// Unauthorized is the number of requests refused for want of valid
// credentials.
func (a *Admin) Unauthorized() uint64 { return a.guard.Unauthorized() }

// Guard returns the admin API's door, to put other operator handlers
// behind the same credentials (their refusals are counted together).
func (a *Admin) Guard() *Guard { return a.guard }

// ServeHTTP implements http.Handler.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	principal, ok := a.guard.Authenticate(r)
	if !ok {
		a.guard.unauthorized(w, r)
		return
	}
	const prefix = "/v1/rules"
	path := r.URL.Path
	switch {
	case path == prefix:
		if !allow(w, r, http.MethodGet) {
			return
		}
		a.list(w, r)
	case path == prefix+"/history":
		if !allow(w, r, http.MethodGet) {
			return
		}
		a.history(w, r)
	case strings.HasPrefix(path, prefix+"/") && !strings.Contains(path[len(prefix)+1:], "/") && len(path) > len(prefix)+1:
		id := path[len(prefix)+1:]
		if !utf8.ValidString(id) {
			writeProblem(w, http.StatusBadRequest, problem{Detail: fmt.Sprintf("the rule id %q is not valid UTF-8", id)})
			return
		}
		switch r.Method {
		case http.MethodGet:
			a.get(w, r, id)
		case http.MethodPut:
			a.put(w, r, principal, id)
		case http.MethodDelete:
			a.delete(w, r, principal, id)
		default:
			w.Header().Set("Allow", "GET, PUT, DELETE")
			writeProblem(w, http.StatusMethodNotAllowed, problem{Detail: fmt.Sprintf("%s is not allowed on a rule", r.Method)})
		}
	default:
		writeProblem(w, http.StatusNotFound, problem{Detail: fmt.Sprintf("no resource at %q", path)})
	}
}

// allow answers 405 unless r uses method.
func allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method {
		return true
	}
	w.Header().Set("Allow", method)
	writeProblem(w, http.StatusMethodNotAllowed, problem{Detail: fmt.Sprintf("%s is not allowed here; use %s", r.Method, method)})
	return false
}

// Authenticate returns the request's principal: a bearer token's, when
// the request carries an Authorization header (which must then be a valid
// token), else a verified client certificate's subject common name.
func (g *Guard) Authenticate(r *http.Request) (string, bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
			return "", false
		}
		sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
		found := -1
		for i := range g.tokens {
			// Every token is compared, found or not.
			if subtle.ConstantTimeCompare(sum[:], g.tokens[i].sum[:]) == 1 {
				found = i
			}
		}
		if found < 0 {
			return "", false
		}
		return g.tokens[found].principal, true
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		cn := r.TLS.VerifiedChains[0][0].Subject.CommonName
		if cn != "" && (lease.RuleChange{Principal: cn, Delete: "x"}).Check() == nil {
			return cn, true
		}
	}
	return "", false
}

// unauthorized answers 401 and logs the attempt, at most a few lines a
// second (the next line says how many went unlogged).
func (g *Guard) unauthorized(w http.ResponseWriter, r *http.Request) {
	g.refused.Add(1)
	if g.logLim.Allow() {
		g.log.Warn("unauthenticated admin request refused", "method", r.Method, "path", r.URL.Path,
			"remote", r.RemoteAddr, "had_token", r.Header.Get("Authorization") != "", "not_logged_before", g.muted.Swap(0))
	} else {
		g.muted.Add(1)
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="`+g.realm+`"`)
	writeProblem(w, http.StatusUnauthorized, problem{Detail: "a valid bearer token or client certificate is required"})
}

// consistent reads the consistent query parameter.
func (a *Admin) consistent(w http.ResponseWriter, r *http.Request) (bool, bool) {
	s := r.URL.Query().Get("consistent")
	if s == "" {
		return a.cfg.Linearizable, true
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, problem{Detail: "consistent must be true or false",
			Errors: []fieldProblem{{Field: "consistent", Message: fmt.Sprintf("%q is not true or false", s)}}})
		return false, false
	}
	return v, true
}

func (a *Admin) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), a.cfg.Timeout)
}

func (a *Admin) list(w http.ResponseWriter, r *http.Request) {
	lin, ok := a.consistent(w, r)
	if !ok {
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	v, rules, err := a.cfg.Store.ReadRules(ctx, lin)
	if err != nil {
		a.storeError(w, err, "")
		return
	}
	out := struct {
		Version uint64            `json:"version"`
		Rules   []json.RawMessage `json:"rules"`
	}{Version: v, Rules: []json.RawMessage{}}
	for _, rule := range rules {
		b, err := RuleJSON(rule)
		if err != nil {
			a.storeError(w, err, rule.ID)
			return
		}
		out.Rules = append(out.Rules, b)
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *Admin) get(w http.ResponseWriter, r *http.Request, id string) {
	lin, ok := a.consistent(w, r)
	if !ok {
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	v, rules, err := a.cfg.Store.ReadRules(ctx, lin)
	if err != nil {
		a.storeError(w, err, id)
		return
	}
	i := slices.IndexFunc(rules, func(x quota.Rule) bool { return x.ID == id })
	if i < 0 {
		writeProblem(w, http.StatusNotFound, problem{Detail: fmt.Sprintf("no rule %q (version %d)", id, v), RuleID: id})
		return
	}
	b, err := RuleJSON(rules[i])
	if err != nil {
		a.storeError(w, err, id)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Version uint64          `json:"version"`
		Rule    json.RawMessage `json:"rule"`
	}{v, b})
}

func (a *Admin) put(w http.ResponseWriter, r *http.Request, principal, id string) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeProblem(w, http.StatusUnsupportedMediaType, problem{Detail: fmt.Sprintf("the body must be application/json, not %q", ct)})
			return
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeProblem(w, http.StatusRequestEntityTooLarge, problem{Detail: fmt.Sprintf("the body is over %d bytes", tooBig.Limit)})
			return
		}
		writeProblem(w, http.StatusBadRequest, problem{Detail: "reading the body: " + err.Error()})
		return
	}
	rule, err := DecodeRuleBody(id, body)
	if err != nil {
		a.bodyError(w, err, id)
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	v, err := a.cfg.Store.PutRule(ctx, principal, rule)
	if err != nil {
		a.storeError(w, err, id)
		return
	}
	a.log.Info("rule put", "rule", id, "version", v, "principal", principal, "remote", r.RemoteAddr)
	out := struct {
		Version uint64          `json:"version"`
		Rule    json.RawMessage `json:"rule"`
	}{Version: v}
	if set, err := quota.NewSet([]quota.Rule{rule}, v); err == nil {
		out.Rule, _ = RuleJSON(set.Rules()[0])
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *Admin) delete(w http.ResponseWriter, r *http.Request, principal, id string) {
	ctx, cancel := a.ctx(r)
	defer cancel()
	v, err := a.cfg.Store.DeleteRule(ctx, principal, id)
	if err != nil {
		a.storeError(w, err, id)
		return
	}
	a.log.Info("rule deleted", "rule", id, "version", v, "principal", principal, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, struct {
		Version uint64 `json:"version"`
	}{v})
}

func (a *Admin) history(w http.ResponseWriter, r *http.Request) {
	lin, ok := a.consistent(w, r)
	if !ok {
		return
	}
	q := HistoryQuery{Linearizable: lin}
	for _, p := range []struct {
		name string
		dst  func(uint64)
		max  uint64
	}{
		{"since", func(v uint64) { q.Since = v }, ^uint64(0)},
		{"limit", func(v uint64) { q.Limit = int(v) }, MaxHistoryLimit},
	} {
		s := r.URL.Query().Get(p.name)
		if s == "" {
			continue
		}
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil || v > p.max {
			writeProblem(w, http.StatusBadRequest, problem{Detail: fmt.Sprintf("%s must be an integer in [0, %d]", p.name, p.max),
				Errors: []fieldProblem{{Field: p.name, Message: fmt.Sprintf("%q is not an integer in [0, %d]", s, p.max)}}})
			return
		}
		p.dst(v)
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	page, err := a.cfg.Store.ReadHistory(ctx, q)
	if err != nil {
		a.storeError(w, err, "")
		return
	}
	type entry struct {
		Version   uint64          `json:"version"`
		At        string          `json:"at"`
		Principal string          `json:"principal"`
		Op        string          `json:"op"`
		RuleID    string          `json:"rule_id"`
		Before    json.RawMessage `json:"before"`
		After     json.RawMessage `json:"after"`
		Digest    string          `json:"digest"`
		RequestID string          `json:"request_id,omitempty"`
	}
	out := struct {
		Version uint64  `json:"version"`
		Oldest  uint64  `json:"oldest"`
		Entries []entry `json:"entries"`
	}{Version: page.Version, Oldest: page.Oldest, Entries: []entry{}}
	for _, e := range page.Entries {
		before, after, err := e.Rules()
		if err != nil {
			a.storeError(w, err, e.RuleID)
			return
		}
		x := entry{Version: e.Version, At: time.Unix(0, e.At).UTC().Format(time.RFC3339Nano), Principal: e.Principal,
			Op: e.Op.String(), RuleID: e.RuleID, Before: json.RawMessage("null"), After: json.RawMessage("null"), Digest: e.Digest,
			RequestID: e.RequestID}
		for _, p := range []struct {
			r   *quota.Rule
			dst *json.RawMessage
		}{{before, &x.Before}, {after, &x.After}} {
			if p.r == nil {
				continue
			}
			if *p.dst, err = RuleJSON(*p.r); err != nil {
				a.storeError(w, err, e.RuleID)
				return
			}
		}
		out.Entries = append(out.Entries, x)
	}
	writeJSON(w, http.StatusOK, out)
}

// bodyError answers a PUT body that did not decode.
func (a *Admin) bodyError(w http.ResponseWriter, err error, id string) {
	p := problem{Detail: err.Error(), RuleID: id, Errors: fieldProblems(err)}
	status := http.StatusBadRequest
	if errors.Is(err, quota.ErrInvalidRule) && !errors.Is(err, quota.ErrSyntax) {
		status = http.StatusUnprocessableEntity
	}
	writeProblem(w, status, p)
}

// storeError answers a store's refusal or failure.
func (a *Admin) storeError(w http.ResponseWriter, err error, id string) {
	p := problem{Detail: err.Error(), RuleID: id}
	switch {
	case errors.Is(err, quota.ErrInvalidRule):
		p.Errors = fieldProblems(err)
		writeProblem(w, http.StatusUnprocessableEntity, p)
	case errors.Is(err, lease.ErrRuleNotFound):
		writeProblem(w, http.StatusNotFound, p)
	case errors.Is(err, lease.ErrBadCommand):
		writeProblem(w, http.StatusBadRequest, p)
	case errors.Is(err, ErrNoLeader), errors.Is(err, ErrNotLeader), errors.Is(err, ErrClosed),
		errors.Is(err, context.DeadlineExceeded):
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, p)
	default:
		a.log.Error("rule store failed", "rule", id, "err", err)
		writeProblem(w, http.StatusInternalServerError, p)
	}
}

// problem is an RFC 9457 problem details body.
type problem struct {
	Type   string         `json:"type"`
	Title  string         `json:"title"`
	Status int            `json:"status"`
	Detail string         `json:"detail,omitempty"`
	RuleID string         `json:"rule_id,omitempty"`
	Errors []fieldProblem `json:"errors,omitempty"`
}

// fieldProblem names one field of a rule and what is wrong with it.
type fieldProblem struct {
	Field   string `json:"field"`
	Message string `json:"message"`
	RuleID  string `json:"rule_id,omitempty"`
}

func fieldProblems(err error) []fieldProblem {
	var out []fieldProblem
	for _, q := range lease.Problems(err) {
		out = append(out, fieldProblem{Field: q.Field, Message: q.Msg, RuleID: q.RuleID})
	}
	return out
}

func writeProblem(w http.ResponseWriter, status int, p problem) {
	p.Type, p.Title, p.Status = "about:blank", http.StatusText(status), status
	b, err := json.Marshal(p)
	if err != nil {
		b = []byte(`{"type":"about:blank","status":500}`)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, problem{Detail: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// DecodeRuleBody reads one rule from a JSON object in the rules file's
// field names (docs/rules-api.md), with id the rule's id from the request
// path: the object may leave "id" out, or must give the same one. It uses
// quota's parser, so errors are *quota.Error values naming the field
// relative to the rule ("window", "overrides[0].burst"), joined, wrapping
// quota.ErrSyntax (bad JSON, a wrong type, an unknown field) or
// quota.ErrInvalidRule (a value validation refuses). It never panics.
func DecodeRuleBody(id string, body []byte) (quota.Rule, error) {
	doc, err := bodyToYAML(id, body)
	if err != nil {
		return quota.Rule{}, err
	}
	rules, err := quota.Parse("", doc)
	if err != nil {
		probs := lease.Problems(err)
		if len(probs) == 0 {
			return quota.Rule{}, err
		}
		out := make([]error, len(probs))
		for i, q := range probs {
			cp := *q
			cp.Field, cp.Line = lease.RelativeField(q.Field), 0
			cp.Msg = lineRef.ReplaceAllString(cp.Msg, "")
			out[i] = &cp
		}
		return quota.Rule{}, errors.Join(out...)
	}
	if len(rules) != 1 {
		return quota.Rule{}, &quota.Error{Msg: "the body must hold one rule", Err: quota.ErrSyntax}
	}
	return rules[0], nil
}

// lineRef is how quota's messages point at a line of a rules file, which
// means nothing for a body written on one line.
var lineRef = regexp.MustCompile(` \(first at line \d+\)`)

// bodyToYAML re-encodes a JSON object as a one-rule rules file that
// quota.Parse reads: {"rules":[OBJECT]}, compact, with every string
// ASCII-only (\u escapes, which YAML's double-quoted scalars read as JSON
// does; YAML knows no "\/" and folds raw line separators), numbers,
// duplicate keys and key order kept, and "id" added when the object has
// none. Malformed JSON, a body that is not one object, nesting deeper than
// maxBodyDepth, or an "id" other than the path's is refused.
func bodyToYAML(id string, body []byte) ([]byte, error) {
	syntax := func(field, format string, args ...any) error {
		return &quota.Error{Field: field, Msg: fmt.Sprintf(format, args...), Err: quota.ErrSyntax}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, syntax("", "malformed JSON: %s", jsonErr(err))
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, syntax("", "the body must be a JSON object")
	}
	var out bytes.Buffer
	out.WriteString(`{"rules":[{`)
	hasID := false
	w := jsonRewriter{dec: dec, out: &out}
	for i := 0; dec.More(); i++ {
		if i > 0 {
			out.WriteByte(',')
		}
		kt, err := dec.Token()
		if err != nil {
			return nil, syntax("", "malformed JSON: %s", jsonErr(err))
		}
		k, _ := kt.(string)
		writeASCII(&out, k)
		out.WriteByte(':')
		if k == "id" {
			hasID = true
			vt, err := dec.Token()
			if err != nil {
				return nil, syntax("", "malformed JSON: %s", jsonErr(err))
			}
			s, ok := vt.(string)
			switch {
			case !ok:
				return nil, syntax("id", "must be a string")
			case s != id:
				return nil, syntax("id", "%q differs from the id in the path %q", s, id)
			}
			if err := w.emit(vt, 1); err != nil {
				return nil, syntax("", "%s", jsonErr(err))
			}
			continue
		}
		if err := w.value(1); err != nil {
			return nil, syntax("", "%s", jsonErr(err))
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, syntax("", "malformed JSON: %s", jsonErr(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, syntax("", "data after the JSON object")
	}
	if !hasID {
		if out.Bytes()[out.Len()-1] != '{' {
			out.WriteByte(',')
		}
		out.WriteString(`"id":`)
		writeASCII(&out, id)
	}
	out.WriteString(`}]}`)
	return out.Bytes(), nil
}

// jsonErr says what is wrong with a body, with the byte offset of a
// syntax error.
func jsonErr(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%v (at byte %d)", se, se.Offset)
	}
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return "unexpected end of the body"
	}
	return err.Error()
}

// jsonRewriter copies JSON values token by token.
type jsonRewriter struct {
	dec *json.Decoder
	out *bytes.Buffer
}

func (w *jsonRewriter) value(depth int) error {
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	return w.emit(tok, depth)
}

func (w *jsonRewriter) emit(tok json.Token, depth int) error {
	switch v := tok.(type) {
	case json.Delim:
		if depth >= maxBodyDepth {
			return fmt.Errorf("nested deeper than %d levels", maxBodyDepth)
		}
		closing := byte('}')
		if v == '[' {
			closing = ']'
		}
		w.out.WriteByte(byte(v))
		for i := 0; w.dec.More(); i++ {
			if i > 0 {
				w.out.WriteByte(',')
			}
			if v == '{' {
				kt, err := w.dec.Token()
				if err != nil {
					return err
				}
				k, _ := kt.(string)
				writeASCII(w.out, k)
				w.out.WriteByte(':')
			}
			if err := w.value(depth + 1); err != nil {
				return err
			}
		}
		if _, err := w.dec.Token(); err != nil {
			return err
		}
		w.out.WriteByte(closing)
	case string:
		writeASCII(w.out, v)
	case json.Number:
		w.out.WriteString(v.String())
	case bool:
		w.out.WriteString(strconv.FormatBool(v))
	case nil:
		w.out.WriteString("null")
	default:
		return fmt.Errorf("unexpected JSON token %v", tok)
	}
	return nil
}

// writeASCII writes s as a double-quoted string both JSON and YAML read
// alike: printable ASCII as is, everything else escaped.
func writeASCII(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r >= 0x20 && r < 0x7f:
			b.WriteByte(byte(r))
		case r <= 0xffff:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			fmt.Fprintf(b, `\U%08x`, r)
		}
	}
	b.WriteByte('"')
}

// RuleJSON encodes a rule as the admin API shows it: a JSON object in the
// rules file's field names and forms, normalised (quota.Marshal's output,
// in its field order), which DecodeRuleBody reads back to the same rule.
func RuleJSON(r quota.Rule) (json.RawMessage, error) {
	y, err := quota.Marshal([]quota.Rule{r})
	if err != nil {
		return nil, fmt.Errorf("lease: rule %q: %w", r.ID, err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(y, &doc); err != nil {
		return nil, fmt.Errorf("lease: rule %q: reading quota's YAML: %w", r.ID, err)
	}
	n := &doc
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	// n is {rules: [RULE]}.
	if n.Kind != yaml.MappingNode || len(n.Content) != 2 || n.Content[1].Kind != yaml.SequenceNode || len(n.Content[1].Content) != 1 {
		return nil, fmt.Errorf("lease: rule %q: unexpected YAML from quota.Marshal", r.ID)
	}
	var out bytes.Buffer
	if err := yamlToJSON(&out, n.Content[1].Content[0], 0); err != nil {
		return nil, fmt.Errorf("lease: rule %q: %w", r.ID, err)
	}
	return out.Bytes(), nil
}

// yamlToJSON writes a YAML node as JSON, keeping mapping order.
func yamlToJSON(b *bytes.Buffer, n *yaml.Node, depth int) error {
	if depth > 32 {
		return errors.New("YAML nested too deeply")
	}
	switch n.Kind {
	case yaml.AliasNode:
		return yamlToJSON(b, n.Alias, depth+1)
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			k, _ := json.Marshal(n.Content[i].Value)
			b.Write(k)
			b.WriteByte(':')
			if err := yamlToJSON(b, n.Content[i+1], depth+1); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := yamlToJSON(b, c, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case yaml.ScalarNode:
		var v any
		switch n.ShortTag() {
		case "!!int":
			var x int64
			if err := n.Decode(&x); err != nil {
				return err
			}
			v = x
		case "!!float":
			var x float64
			if err := n.Decode(&x); err != nil {
				return err
			}
			v = x
		case "!!bool":
			var x bool
			if err := n.Decode(&x); err != nil {
				return err
			}
			v = x
		case "!!null":
			v = nil
		default:
			v = n.Value
		}
		s, err := json.Marshal(v)
		if err != nil {
			return err
		}
		b.Write(s)
	default:
		return fmt.Errorf("unexpected YAML node kind %d", n.Kind)
	}
	return nil
}
