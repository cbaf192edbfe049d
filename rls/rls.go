// Package rls serves Envoy's rate-limit service,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, over a
// weir Node: the descriptors Envoy sends are matched against an imported
// envoyproxy/ratelimit configuration (package envoyconf) and charged to the
// node's rules with Node.CheckKeys. There is no Redis: the node (alone or
// in its cluster) is the counter store.
//
//	cfg, _ := envoyconf.Compile(envoyconf.Options{}, domain)
//	node, _ := weir.New(weir.Config{Rules: cfg.Rules(), Cluster: ...})
//	srv, _ := rls.Listen("127.0.0.1:8081", rls.New(node, cfg))
//	defer srv.Close()
//
// A call never waits on an unreachable peer or lease group beyond the
// call's deadline and the node's decide timeout: the rule's on_failure
// answers then, and the answer is counted as degraded (weir_fail_open_total)
// and marked in the response's dynamic metadata ("weir.degraded": true).
package rls

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"net"
	"net/http"
	"sort"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/envoyconf"
)

// Service implements rlsv3.RateLimitServiceServer over a weir Node. It is
// safe for concurrent use.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	node  *weir.Node
	cur   atomic.Pointer[served]
	stats statsTable
	maxID int
	// headers, hLimit, hRemaining, hReset: WithHeaders, WithEnvoyHeaderNames.
	headers                    HeaderMode
	hLimit, hRemaining, hReset string
	globalShadow               bool // WithGlobalShadow
}

// Option configures a Service.
type Option func(*Service)

// WithMaxIdentityBytes sets the longest identity sent to the node as is; a
// longer descriptor value path is replaced by "sha256:" and its hash, so
// that long values are still limited (each distinct path its own bucket)
// instead of refused. It must not exceed the node's
// Config.MaxIdentityBytes. The default is weir.DefaultMaxIdentityBytes.
func WithMaxIdentityBytes(n int) Option { return func(s *Service) { s.maxID = n } }

// New returns a Service answering from cfg with node (a nil cfg knows no
// domain: every call is OK). The node must hold cfg.Rules() (weir.Config.Rules, Node.SetRules, or a rules file written
// from them).
func New(node *weir.Node, cfg *envoyconf.Config, opts ...Option) *Service {
	s := &Service{node: node, maxID: weir.DefaultMaxIdentityBytes, stats: statsTable{cap: DefaultValueSeries},
		hLimit: "RateLimit-Limit", hRemaining: "RateLimit-Remaining", hReset: "RateLimit-Reset"}
	for _, o := range opts {
		o(s)
	}
	s.cur.Store(s.stats.serve(cfg))
	return s
}

// SetConfig swaps the descriptor configuration in use. Install the new
// config's rules in the node first (Node.SetRules): a descriptor whose rule
// the node does not hold fails the call with codes.FailedPrecondition, and
// Envoy then applies its failure_mode_deny.
func (s *Service) SetConfig(cfg *envoyconf.Config) { s.cur.Store(s.stats.serve(cfg)) }

// Register registers the service on a gRPC server.
func (s *Service) Register(r grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(r, s) }

// maxCost caps a hits_addend: larger ones can never pass any rule anyway.
const maxCost = math.MaxInt64 / 4

// ShouldRateLimit answers one Envoy rate-limit request, as
// envoyproxy/ratelimit does: a domain and at least one descriptor are
// required (codes.InvalidArgument otherwise); each descriptor gets a status
// in request order; a descriptor with no limit (an unknown domain
// included), an unlimited one and one whose limit another matched limit
// replaces are OK and count nothing; a shadow limit counts and answers OK;
// the overall code is OVER_LIMIT when some descriptor is. A descriptor's
// hits_addend, when set, is its cost, else the request's hits_addend, else
// 1; a cost of zero looks without charging. Descriptors with
// is_negative_hits (a refund) are looked at, not charged: weir does not
// give tokens back on request. A per-descriptor limit override (the
// descriptor's limit field) is ignored: the configured limit applies,
// except under envoyconf's Fidelity, where the answers are
// envoyproxy/ratelimit's (shouldFidelity), overrides honoured.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	sv := s.cur.Load()
	cfg := sv.cfg
	if cfg == nil { // New(node, nil): no domain is configured
		cfg = &envoyconf.Config{}
	}
	if cfg.Fidelity() {
		return s.shouldFidelity(ctx, req, sv)
	}
	n := len(req.Descriptors)
	now := time.Now()
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	over := make([]bool, n) // the descriptor is over an enforced limit
	matches := make([]envoyconf.Match, n)
	limits := make([]*envoyconf.Limit, n)
	entries := make([]envoyconf.Entry, 0, 4)
	for i, d := range req.Descriptors {
		entries = entries[:0]
		for _, e := range d.GetEntries() {
			entries = append(entries, envoyconf.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		if m, ok := cfg.Match(req.Domain, entries); ok {
			matches[i], limits[i] = m, m.Limit
		}
	}
	replaced := envoyconf.Replaced(limits)
	var checks []weir.KeyCheck
	var checked []int // descriptor index of each check
	for i, lim := range limits {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		switch {
		case lim == nil || replaced[i]:
		case lim.Unlimited:
			st.LimitRemaining = math.MaxUint32
		case lim.Blocked:
			// A zero limit, counted by no rule: every request is over it.
			st.CurrentLimit = currentLimit(lim)
			sv.stats[lim].of(matches[i].StatsKey).count(0, uint64(cost(req, req.Descriptors[i])), true, lim.Shadow, 0)
			over[i] = !lim.Shadow && !lim.Quota
			if over[i] {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		default:
			checks = append(checks, weir.KeyCheck{Rule: lim.RuleID, Key: s.identity(matches[i].Identity), Cost: cost(req, req.Descriptors[i])})
			checked = append(checked, i)
		}
	}
	if len(checks) == 0 {
		return s.finish(resp, nil, over, now), nil
	}
	dec, err := s.node.CheckKeys(ctx, checks)
	switch {
	case errors.Is(err, weir.ErrUnknownRule):
		return nil, status.Errorf(codes.FailedPrecondition, "rls: the node does not hold the configuration's rules: %v", err)
	case err != nil:
		return nil, status.Errorf(codes.Internal, "rls: %v", err)
	}
	for j, r := range dec.Results() {
		i := checked[j]
		st := resp.Statuses[i]
		st.CurrentLimit = currentLimit(limits[i])
		remaining := max(r.Remaining, 0)
		st.LimitRemaining = uint32(min(remaining, math.MaxUint32))
		st.DurationUntilReset = durationpb.New(r.Reset)
		sv.stats[limits[i]].of(matches[i].StatsKey).count(uint64(limits[i].RequestsPerUnit), uint64(cost(req, req.Descriptors[i])), !r.Allowed || r.ShadowRejected, limits[i].Shadow, uint64(remaining))
		switch {
		case r.Allowed:
		case limits[i].Quota:
			// quota_mode: over the limit, answered OK, with no time to reset.
			st.DurationUntilReset = nil
		default:
			over[i] = true
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	if dec.Degraded {
		resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{"weir.degraded": structpb.NewBoolValue(true)}}
	}
	return s.finish(resp, &dec, over, now), nil
}

// finish adds the response headers of the service's HeaderMode (dec is the
// node's decision, nil when nothing was checked) and applies the global
// shadow mode.
func (s *Service) finish(resp *rlsv3.RateLimitResponse, dec *weir.Decision, over []bool, now time.Time) *rlsv3.RateLimitResponse {
	switch {
	case s.headers == HeadersEnvoy:
		resp.ResponseHeadersToAdd = s.envoyHeaders(resp.Statuses, over, now)
	case s.headers == HeadersWeir && dec != nil:
		h := http.Header{}
		dec.WriteHeaders(h)
		keys := make([]string, 0, len(h))
		for k := range h {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			for _, v := range h[k] {
				resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: k, Value: v})
			}
		}
	}
	if s.globalShadow {
		resp.OverallCode = rlsv3.RateLimitResponse_OK
	}
	return resp
}

// identity returns id, or its hash when it is too long to send as is.
func (s *Service) identity(id string) string {
	if len(id) <= s.maxID {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// cost is a descriptor's hits: its own hits_addend when set, else the
// request's, else 1; zero for a refund (is_negative_hits), which is only
// looked at.
func cost(req *rlsv3.RateLimitRequest, d *commonv3.RateLimitDescriptor) int64 {
	if d.GetIsNegativeHits() {
		return 0
	}
	if h := d.GetHitsAddend(); h != nil {
		return int64(min(h.GetValue(), maxCost))
	}
	return max(int64(req.GetHitsAddend()), 1)
}

func currentLimit(l *envoyconf.Limit) *rlsv3.RateLimitResponse_RateLimit {
	return &rlsv3.RateLimitResponse_RateLimit{Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit)}
}

// Server is a gRPC server serving one Service on a listener: the small
// helper tests and the weir daemon use.
type Server struct {
	g    *grpc.Server
	lis  net.Listener
	done chan error
}

// Listen listens on addr (host:port; port 0 picks one) and serves svc there
// until Close.
func Listen(addr string, svc *Service, opts ...grpc.ServerOption) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return Serve(lis, svc, opts...), nil
}

// StreamWorkers is the number of goroutines ServerOptions keeps to run
// calls: each keeps the stack it grew, where a goroutine per call grows
// one on every call (runtime.morestack, a tenth of a node's CPU at
// saturation); a call that finds every worker busy gets a goroutine of its
// own, as without workers.
const StreamWorkers = 64

// ServerOptions are the gRPC server options Serve and Listen start with
// (before the caller's, which may override them): StreamWorkers stream
// workers (grpc.NumStreamWorkers). A server of your own that mounts the
// service with Register may take them too.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(StreamWorkers)}
}

// Serve serves svc on lis until Close, with ServerOptions and then opts.
func Serve(lis net.Listener, svc *Service, opts ...grpc.ServerOption) *Server {
	s := &Server{g: grpc.NewServer(append(ServerOptions(), opts...)...), lis: lis, done: make(chan error, 1)}
	svc.Register(s.g)
	go func() { s.done <- s.g.Serve(lis) }()
	return s
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Close stops the server: calls in flight get up to five seconds to finish,
// then are cut off.
func (s *Server) Close() error {
	stopped := make(chan struct{})
	go func() { s.g.GracefulStop(); close(stopped) }()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		s.g.Stop()
		<-stopped
	}
	if err := <-s.done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
