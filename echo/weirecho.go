// Package weirecho is weir's rate-limiting middleware for the echo router.
//
// Middleware decides every request with a weir.Node, sets the rate-limit
// headers on every response, and returns a rejection as an error, in echo's
// idiom: an *echo.HTTPError (429, or 400 for an identity longer than the
// node's cap) whose Internal error is a *Rejection. Echo's default error
// handler answers it with its JSON message and the rate-limit headers
// already set; ErrorHandler answers it byte for byte as weir's net/http
// middleware does (429, Retry-After, an application/problem+json body
// naming the violated rules):
//
//	e := echo.New()
//	e.HTTPErrorHandler = weirecho.ErrorHandler(e.DefaultHTTPErrorHandler)
//	e.Use(weirecho.Middleware(node, weirecho.Config{
//		User: func(c echo.Context) string { u, _ := c.Get("user").(string); return u },
//	}))
package weirecho

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/weir-dev/weir"
)

// ContextKey is the echo context key under which Middleware stores the
// request's *weir.Decision for the handlers after it (see Decision).
const ContextKey = "weir.decision"

// Config adapts the middleware to an application. Its zero value derives
// every identity as weir's net/http middleware does.
type Config struct {
	// User returns the authenticated user of a request for rules keyed on
	// "user", typically a value an authentication middleware put in echo's
	// context with c.Set. Nil means the node's Config.UserFunc.
	User func(c echo.Context) string

	// Tier returns the caller's tier for rules with tiers. Nil means the
	// node's Config.TierFunc.
	Tier func(c echo.Context) string
}

// Rejection is the error Middleware returns, inside an *echo.HTTPError,
// for a request its decision does not admit.
type Rejection struct {
	// Decision is the node's decision; its results name the violated rules.
	Decision weir.Decision
}

// Error names the violated rules, or the reason the request could not be
// evaluated.
func (r *Rejection) Error() string {
	if r.Decision.Err != nil {
		return r.Decision.Err.Error()
	}
	var names []string
	for _, res := range r.Decision.Results() {
		if !res.Allowed {
			names = append(names, res.Rule)
		}
	}
	return "rate limit exceeded: " + strings.Join(names, ", ")
}

// Middleware returns echo middleware that decides each request with n. An
// admitted request gets the rate-limit headers and goes on to next, after a
// leaky-bucket rule's delay has been waited out (or the request's context
// ends it: the middleware then returns the context's error); concurrency
// slots are released when next returns. It is safe for concurrent use.
func Middleware(n *weir.Node, cfg Config) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			req := n.RequestFromHTTP(r)
			if cfg.User != nil {
				req.User = cfg.User(c)
			}
			if cfg.Tier != nil {
				req.Tier = cfg.Tier(c)
			}
			d := n.Allow(r.Context(), req)
			defer d.Done()
			if d.Err != nil {
				return &echo.HTTPError{Code: http.StatusBadRequest, Message: d.Err.Error(), Internal: &Rejection{Decision: d}}
			}
			d.WriteHeaders(c.Response().Header())
			if !d.Allowed {
				rej := &Rejection{Decision: d}
				return &echo.HTTPError{Code: http.StatusTooManyRequests, Message: rej.Error(), Internal: rej}
			}
			if d.Delay > 0 {
				t := time.NewTimer(d.Delay)
				select {
				case <-t.C:
				case <-r.Context().Done():
					t.Stop()
					return r.Context().Err()
				}
			}
			c.Set(ContextKey, &d)
			return next(c)
		}
	}
}

// ErrorHandler returns an echo error handler that answers a rejection from
// Middleware with weir.WriteRejection, the bytes weir's net/http middleware
// answers with, and hands every other error to next.
func ErrorHandler(next echo.HTTPErrorHandler) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		var rej *Rejection
		if errors.As(err, &rej) && !c.Response().Committed {
			weir.WriteRejection(c.Response(), &rej.Decision)
			return
		}
		next(err, c)
	}
}

// Decision returns the decision Middleware made for the request of c. ok is
// false outside the middleware. The decision is valid until the middleware
// returns.
func Decision(c echo.Context) (d *weir.Decision, ok bool) {
	d, ok = c.Get(ContextKey).(*weir.Decision)
	return d, ok
}
