// Package weirgin is weir's rate-limiting middleware for the gin router.
//
// Middleware decides every request with a weir.Node and answers as weir's
// net/http middleware does: the rate-limit headers on every response, and a
// rejected request aborted with 429, Retry-After and an
// application/problem+json body naming the violated rules (400 for an
// identity longer than the node's cap). The identities come from the node's
// Config (API key headers, client IP through its trusted proxies) and,
// through Config.User and Config.Tier, from gin's context:
//
//	node, err := weir.New(weir.Config{RulesFile: "rules.yaml"})
//	...
//	r := gin.New()
//	r.Use(weirgin.Middleware(node, weirgin.Config{
//		User: func(c *gin.Context) string { return c.GetString("user") },
//	}))
package weirgin

import (
	"time"

	"github.com/gin-gonic/gin"
	"github.com/weir-dev/weir"
)

// ContextKey is the gin context key under which Middleware stores the
// request's *weir.Decision for the handlers after it (see Decision).
const ContextKey = "weir.decision"

// Config adapts the middleware to an application. Its zero value derives
// every identity as weir's net/http middleware does and answers rejections
// with the same bytes.
type Config struct {
	// User returns the authenticated user of a request for rules keyed on
	// "user", typically a value an authentication middleware put in gin's
	// context with c.Set. Nil means the node's Config.UserFunc.
	User func(c *gin.Context) string

	// Tier returns the caller's tier for rules with tiers. Nil means the
	// node's Config.TierFunc.
	Tier func(c *gin.Context) string

	// Reject answers a request the decision does not admit; it must abort
	// the chain (c.AbortWithStatusJSON, for example). The rate-limit
	// headers and Retry-After are already set on c.Writer when it is
	// called. Nil means weir.WriteRejection's answer: 429 (400 when d.Err is
	// set) with an application/problem+json body, byte for byte the net/http
	// middleware's.
	Reject func(c *gin.Context, d *weir.Decision)
}

// Middleware returns gin middleware that decides each request with n. An
// admitted request gets the rate-limit headers and goes on down the chain,
// after a leaky-bucket rule's delay has been waited out (or the request's
// context ends it, aborting the chain); concurrency slots are released when
// the rest of the chain returns. It is safe for concurrent use.
func Middleware(n *weir.Node, cfg Config) gin.HandlerFunc {
	return func(c *gin.Context) {
		req := n.RequestFromHTTP(c.Request)
		if cfg.User != nil {
			req.User = cfg.User(c)
		}
		if cfg.Tier != nil {
			req.Tier = cfg.Tier(c)
		}
		d := n.Allow(c.Request.Context(), req)
		defer d.Done()
		if d.Err != nil || !d.Allowed {
			if cfg.Reject == nil {
				c.Abort()
				weir.WriteRejection(c.Writer, &d)
				return
			}
			d.WriteHeaders(c.Writer.Header())
			cfg.Reject(c, &d)
			return
		}
		d.WriteHeaders(c.Writer.Header())
		if d.Delay > 0 {
			t := time.NewTimer(d.Delay)
			select {
			case <-t.C:
			case <-c.Request.Context().Done():
				t.Stop()
				c.Abort()
				return
			}
		}
		c.Set(ContextKey, &d)
		c.Next()
	}
}

// Decision returns the decision Middleware made for the request of c, so a
// handler can see, for example, that it was Degraded. ok is false outside
// the middleware. The decision is valid until the middleware returns.
func Decision(c *gin.Context) (d *weir.Decision, ok bool) {
	v, ok := c.Get(ContextKey)
	if !ok {
		return nil, false
	}
	d, ok = v.(*weir.Decision)
	return d, ok
}
