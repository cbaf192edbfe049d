package weir

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/internal/clientip"
)

// Middleware wraps next with rate limiting. For every request it derives
// the identities (API key header, user, client IP through trusted proxies),
// decides with Allow, and sets on every response:
//
//   - X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset (unix
//     seconds) for the most restrictive rule;
//   - RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers-10)
//     for every rule that applied.
//
// A rejected request gets 429, Retry-After in whole seconds rounded up, and
// an application/problem+json body naming the violated rules; next is not
// called. A request whose identity is longer than Config.MaxIdentityBytes
// gets 400. A leaky-bucket rule's delay is waited out (or the request's
// context ends it) before next is called. Concurrency slots are released when
// next returns.
func (n *Node) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := n.requestFromHTTP(r, n.eng.load().needs, true)
		// The decision, the context that hands it to next and the header
		// values are one allocation.
		s := new(served)
		n.decide(r.Context(), &req, &s.d)
		defer s.d.Done()
		if s.d.Err != nil {
			writeProblem(w, http.StatusBadRequest, problem{
				Title:  "Bad Request",
				Status: http.StatusBadRequest,
				Detail: s.d.Err.Error(),
			})
			return
		}
		writeHeaders(w.Header(), &s.d, &s.hv)
		if !s.d.Allowed {
			writeRejection(w, &s.d)
			return
		}
		if s.d.Delay > 0 {
			t := time.NewTimer(s.d.Delay)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		s.ctx = decisionCtx{Context: r.Context(), d: &s.d}
		next.ServeHTTP(w, r.WithContext(&s.ctx))
	})
}

// served is what the middleware keeps of one request.
type served struct {
	d   Decision
	ctx decisionCtx
	hv  headerValues
}

// decisionCtx is the request's context with its Decision, as
// context.WithValue(parent, decisionKey{}, d) would make it, without an
// allocation of its own.
type decisionCtx struct {
	context.Context
	d *Decision
}

// Value returns the decision for decisionKey{} and asks the parent for
// every other key.
func (c *decisionCtx) Value(key any) any {
	if _, ok := key.(decisionKey); ok {
		return c.d
	}
	return c.Context.Value(key)
}

// String names the context the way context's own types do.
func (c *decisionCtx) String() string {
	return fmt.Sprintf("%v.WithValue(weir.Decision)", c.Context)
}

type decisionKey struct{}

// FromContext returns the rate-limit Decision the middleware made for the
// request whose context ctx is, so the upstream can see, for example, that
// a decision was Degraded (made by on_failure while an owner was
// unreachable). ok is false outside the middleware.
func FromContext(ctx context.Context) (d *Decision, ok bool) {
	d, ok = ctx.Value(decisionKey{}).(*Decision)
	return d, ok
}

// RequestFromHTTP fills a Request from an HTTP request: method, path,
// headers, the client IP (X-Forwarded-For and Forwarded are believed only
// from Config.TrustedProxies), and the user and tier from Config.UserFunc
// and Config.TierFunc.
func (n *Node) RequestFromHTTP(r *http.Request) Request {
	return n.requestFromHTTP(r, inputs{ip: true, user: true, tier: true}, false)
}

// inputs says which request attributes some rule in force reads, so the
// middleware derives (and allocates) only those.
type inputs struct{ ip, user, tier bool }

// requestFromHTTP fills a Request with the attributes of r that need
// names. With lazyIP the client IP is resolved only when a rule's key chain
// reaches its ip source (Request.clientIP).
func (n *Node) requestFromHTTP(r *http.Request, need inputs, lazyIP bool) Request {
	req := Request{Method: r.Method, Path: CleanPath(r.URL.Path), Header: r.Header}
	switch {
	case need.ip && lazyIP:
		req.ipFrom, req.ipRes = r, n.ip
	case need.ip:
		req.ClientIP = resolveIP(n.ip, r)
	}
	if need.user && n.cfg.UserFunc != nil {
		req.User = n.cfg.UserFunc(r)
	}
	if need.tier && n.cfg.TierFunc != nil {
		req.Tier = n.cfg.TierFunc(r)
	}
	return req
}

// resolveIP returns r's client IP through the trusted proxies of res. An
// unparseable peer address (never from net/http's server, possible from a
// hand-made request) yields no client IP rather than an identity the caller
// did not mean.
func resolveIP(res *clientip.Resolver, r *http.Request) string {
	ip, err := res.ClientIP(r.RemoteAddr, r.Header)
	if err != nil {
		return ""
	}
	return ip.String()
}

// CleanPath returns p in the canonical form rules are matched against, so
// that "/a/../search" or "//search" cannot slip past a "/search" rule: what
// the middleware puts in Request.Path. Callers that fill a Request from an
// HTTP request themselves (gateway modules) clean the path with it. It
// allocates only for a path that needs cleaning.
func CleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' || strings.Contains(p, "//") || strings.Contains(p, "/.") {
		c := path.Clean("/" + p)
		if c != "/" && strings.HasSuffix(p, "/") {
			c += "/"
		}
		return c
	}
	return p
}

// ceilSeconds rounds a duration up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// headerValues holds what writeHeaders sets: the five values and their
// bytes (while they fit in buf), so that they take no allocation of their
// own where headerValues is part of one (the middleware's served).
type headerValues struct {
	vals [5]string
	buf  [160]byte
}

// writeHeaders sets the rate-limit fields of a decision on h, their values
// held in hv, which must not be written again.
func writeHeaders(h http.Header, d *Decision, hv *headerValues) {
	lim, ok := d.Limiting()
	if !ok {
		return
	}
	// All five values are built in one buffer and turned into one string;
	// the header keys are written in canonical form, so net/http need not
	// canonicalise (and allocate) them on every response.
	b := hv.buf[:0]
	var ends [5]int
	b = strconv.AppendInt(b, lim.Limit, 10)
	ends[0] = len(b)
	b = strconv.AppendInt(b, lim.Remaining, 10)
	ends[1] = len(b)
	b = strconv.AppendInt(b, ceilSeconds(time.Duration(d.At.UnixNano())+lim.Reset), 10)
	ends[2] = len(b)
	// Rule ids are restricted to [A-Za-z0-9_.:-], so they need no escaping
	// inside a structured-field string.
	for i, r := range d.Results() {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(append(append(b, '"'), r.Rule...), `";q=`...)
		b = strconv.AppendInt(b, r.Limit, 10)
		b = strconv.AppendInt(append(b, ";w="...), max(ceilSeconds(r.Window), 1), 10)
	}
	ends[3] = len(b)
	for i, r := range d.Results() {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(append(append(b, '"'), r.Rule...), `";r=`...)
		b = strconv.AppendInt(b, r.Remaining, 10)
		b = strconv.AppendInt(append(b, ";t="...), ceilSeconds(r.Reset), 10)
	}
	ends[4] = len(b)
	// b is never written again, in hv.buf or (past its size) on the heap.
	all := unsafe.String(unsafe.SliceData(b), len(b))
	vals := &hv.vals
	for i, start := range [5]int{0, ends[0], ends[1], ends[2], ends[3]} {
		vals[i] = all[start:ends[i]]
	}
	h["X-Ratelimit-Limit"] = vals[0:1:1]
	h["X-Ratelimit-Remaining"] = vals[1:2:2]
	h["X-Ratelimit-Reset"] = vals[2:3:3]
	h["Ratelimit-Policy"] = vals[3:4:4]
	h["Ratelimit"] = vals[4:5:5]
}

// problem is an RFC 9457 problem details body.
type problem struct {
	Type     string          `json:"type"`
	Title    string          `json:"title"`
	Status   int             `json:"status"`
	Detail   string          `json:"detail,omitempty"`
	Violated []violatedRule  `json:"violated_rules,omitempty"`
	Retry    *retryAfterBody `json:"retry_after_seconds,omitempty"`
}

type retryAfterBody = int64

type violatedRule struct {
	Rule              string `json:"rule"`
	Limit             int64  `json:"limit"`
	Window            string `json:"window"`
	Burst             int64  `json:"burst"`
	Cost              int64  `json:"cost"`
	RetryAfterSeconds *int64 `json:"retry_after_seconds,omitempty"`
	Never             bool   `json:"never,omitempty"`
	LockedOut         bool   `json:"locked_out,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, p problem) {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(p)
}

// writeRejection answers a rejected request: 429, Retry-After, and a
// problem body naming every violated rule.
func writeRejection(w http.ResponseWriter, d *Decision) {
	p := problem{Title: "Too Many Requests", Status: http.StatusTooManyRequests}
	var names []string
	for _, r := range d.Results() {
		if r.Allowed {
			continue
		}
		v := violatedRule{Rule: r.Rule, Limit: r.Limit, Window: r.Window.String(), Burst: r.Burst, Cost: r.Cost, LockedOut: r.Locked}
		if r.RetryAfter == bucket.Never {
			v.Never = true
		} else {
			s := ceilSeconds(r.RetryAfter)
			v.RetryAfterSeconds = &s
		}
		p.Violated = append(p.Violated, v)
		names = append(names, r.Rule)
	}
	if s, ok := retryAfterSeconds(d); ok {
		w.Header().Set("Retry-After", strconv.FormatInt(s, 10))
		p.Retry = &s
		p.Detail = "rate limit exceeded: " + strings.Join(names, ", ")
	} else {
		p.Detail = "the request costs more than the burst of " + strings.Join(names, ", ") + " allows; it can never pass"
	}
	writeProblem(w, http.StatusTooManyRequests, p)
}
