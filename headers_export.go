package weir

import (
	"net/http"
	"strconv"

	"github.com/weir-dev/weir/bucket"
)

// WriteHeaders sets on h the rate-limit fields the middleware sets on a
// response for d: X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (unix seconds) for the most restrictive rule,
// RateLimit-Policy and RateLimit for every rule, and, when d rejects,
// Retry-After in whole seconds (at least 1; left out when no retry can ever
// pass). A Decision with no rule sets nothing. It is how other transports
// (Envoy's rate-limit service, gRPC) answer with the same fields.
func (d *Decision) WriteHeaders(h http.Header) {
	writeHeaders(h, d, new(headerValues))
	if s, ok := retryAfterSeconds(d); ok && !d.Allowed {
		h["Retry-After"] = []string{strconv.FormatInt(s, 10)}
	}
}

// retryAfterSeconds is the Retry-After value of a rejection: whole seconds
// rounded up, at least 1; ok is false when some rejecting rule can never
// pass (bucket.Never).
func retryAfterSeconds(d *Decision) (s int64, ok bool) {
	ra := d.RetryAfter()
	if ra == bucket.Never {
		return 0, false
	}
	return max(ceilSeconds(ra), 1), true
}

// WriteRejection answers a request that d does not admit exactly as the
// middleware does: 400 with an application/problem+json body when d.Err is
// set; otherwise the fields of WriteHeaders, 429, Cache-Control: no-store
// and a problem+json body naming every violated rule. It writes nothing when
// d admits the request. It is how routers with their own middleware
// conventions (gin, echo, Caddy) answer a rejection with the same bytes.
func WriteRejection(w http.ResponseWriter, d *Decision) {
	if d.Err != nil {
		writeProblem(w, http.StatusBadRequest, problem{
			Title:  "Bad Request",
			Status: http.StatusBadRequest,
			Detail: d.Err.Error(),
		})
		return
	}
	if d.Allowed {
		return
	}
	writeHeaders(w.Header(), d, new(headerValues))
	writeRejection(w, d)
}
