// Package grpclimit rate-limits gRPC servers with a weir Node: unary and
// stream server interceptors that decide every call with Node.Allow.
//
// A call is a weir Request whose Path is the full method name
// ("/pkg.Service/Method"), so rules select calls by method with their usual
// match (path: /pkg.Service/Method, prefix: /pkg.Service, or a pattern),
// and identities come from the rules' key chains: header:NAME reads the
// incoming metadata NAME, ip the peer's address, user and tiers from
// Config.User and Config.Tier (FromMetadata, FullMethod and PeerAddress
// make the usual ones).
//
//	lim := grpclimit.Config{Node: node, User: grpclimit.FromMetadata("x-user-id")}
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(lim.Unary()),
//		grpc.ChainStreamInterceptor(lim.Stream()))
//
// A call over its limit fails with codes.ResourceExhausted, carrying an
// errdetails.RetryInfo (when a retry can ever pass) and an
// errdetails.QuotaFailure naming the violated rules; the handler is not
// called. Every decided call, allowed or not, gets the rate-limit fields
// the HTTP middleware sets (x-ratelimit-limit, x-ratelimit-remaining,
// x-ratelimit-reset, ratelimit-policy, ratelimit, and retry-after on a
// rejection) as trailing metadata.
package grpclimit

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/bucket"
)

// KeyFunc returns an identity (or a tier) for a call; "" means none.
type KeyFunc func(ctx context.Context, fullMethod string) string

// FromMetadata returns the first value of the incoming metadata key (case
// does not matter), or "".
func FromMetadata(key string) KeyFunc {
	key = strings.ToLower(key)
	return func(ctx context.Context, _ string) string {
		if vs := metadata.ValueFromIncomingContext(ctx, key); len(vs) > 0 {
			return vs[0]
		}
		return ""
	}
}

// FullMethod returns the call's full method name: one bucket per method.
func FullMethod() KeyFunc {
	return func(_ context.Context, fullMethod string) string { return fullMethod }
}

// PeerAddress returns the IP of the call's peer (without the port), or "".
func PeerAddress() KeyFunc {
	return func(ctx context.Context, _ string) string { return peerIP(ctx) }
}

func peerIP(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	if ta, ok := p.Addr.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		return host
	}
	return ""
}

// Config configures the interceptors. Only Node is required.
type Config struct {
	// Node decides every call.
	Node *weir.Node
	// User is the identity of rules keyed on "user"; nil means none.
	User KeyFunc
	// Tier is the caller's tier, for rules with tiers; nil means none.
	Tier KeyFunc
	// Cost returns what a call costs; nil or a value <= 0 means each rule's
	// own cost.
	Cost func(ctx context.Context, fullMethod string) int64
	// Method is the request method rules see (for match.methods and
	// cost_by_method); "" means "POST", the HTTP method of every gRPC call.
	Method string
}

// Unary returns the unary server interceptor.
func (c Config) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		d, err := c.decide(ctx, info.FullMethod, func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) })
		if err != nil {
			return nil, err
		}
		defer d.Done()
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor. A stream is decided once,
// when it opens.
func (c Config) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		d, err := c.decide(ss.Context(), info.FullMethod, ss.SetTrailer)
		if err != nil {
			return err
		}
		defer d.Done()
		return handler(srv, ss)
	}
}

// decide decides one call, sets its trailers, waits out a leaky bucket's
// delay, and returns the status error of a call that may not proceed.
func (c Config) decide(ctx context.Context, fullMethod string, setTrailer func(metadata.MD)) (*weir.Decision, error) {
	req := weir.Request{Method: c.Method, Path: fullMethod, ClientIP: peerIP(ctx)}
	if req.Method == "" {
		req.Method = http.MethodPost
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		req.Header = make(http.Header, len(md))
		for k, vs := range md {
			if !strings.HasPrefix(k, ":") {
				req.Header[http.CanonicalHeaderKey(k)] = vs
			}
		}
	}
	if c.User != nil {
		req.User = c.User(ctx, fullMethod)
	}
	if c.Tier != nil {
		req.Tier = c.Tier(ctx, fullMethod)
	}
	if c.Cost != nil {
		req.Cost = max(c.Cost(ctx, fullMethod), 0)
	}
	d := c.Node.Allow(ctx, req)
	if d.Err != nil {
		return nil, status.Error(codes.InvalidArgument, d.Err.Error())
	}
	h := http.Header{}
	d.WriteHeaders(h)
	if len(h) > 0 {
		md := make(metadata.MD, len(h))
		for k, vs := range h {
			md[strings.ToLower(k)] = vs
		}
		setTrailer(md)
	}
	if !d.Allowed {
		return nil, rejection(&d)
	}
	if d.Delay > 0 {
		t := time.NewTimer(d.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			d.Done()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return &d, nil
}

// rejection is the ResourceExhausted status of a rejected call.
func rejection(d *weir.Decision) error {
	var names []string
	qf := &errdetails.QuotaFailure{}
	for _, r := range d.Results() {
		if r.Allowed {
			continue
		}
		names = append(names, r.Rule)
		qf.Violations = append(qf.Violations, &errdetails.QuotaFailure_Violation{
			Subject:     "rule:" + r.Rule,
			Description: limitText(r),
		})
	}
	msg := "rate limit exceeded: " + strings.Join(names, ", ")
	ra := d.RetryAfter()
	if ra == bucket.Never {
		msg = "the call costs more than the burst of " + strings.Join(names, ", ") + " allows; it can never pass"
	}
	st := status.New(codes.ResourceExhausted, msg)
	details := []protoadapt.MessageV1{qf}
	if ra != bucket.Never {
		details = []protoadapt.MessageV1{&errdetails.RetryInfo{RetryDelay: durationpb.New(ra)}, qf}
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

// limitText describes a rule's limit: "100 per 1m0s, burst 20, cost 1".
func limitText(r weir.RuleResult) string {
	return fmt.Sprintf("%d per %v, burst %d, cost %d", r.Limit, r.Window, r.Burst, r.Cost)
}
