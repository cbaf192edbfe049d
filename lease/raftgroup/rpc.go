package raftgroup

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/internal/golabel"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup/grouppb"
	"github.com/weir-dev/weir/quota"
)

// This file is the forwarding service: a follower sends a write to the
// leader's LeaseGroup.Propose (or AddVoter) and returns its reply. A client
// that is not a voter (client.go) calls ChangeRule and ReadRules on any
// voter, which forwards as its own Group methods do. The
// leader applies a forwarded command exactly as its own (stamped with its
// clock, after its Takeover); a node that is not the leader answers
// NOT_LEADER and the follower retries with whoever leads then. Nothing is
// forwarded twice by the receiver, so a request cannot loop.

// The doors (docs/security.md). Without ServerTLS the forwarding service
// and the Raft port are open to whoever reaches them: run them on a
// trusted network. With ServerTLS:
//   - a caller without a verified client certificate is refused outright;
//   - a caller whose certificate names a voter (Config.VoterNames) may
//     do everything: it is a replica of the log;
//   - any other verified caller (a gateway's lease Client) may read rules,
//     propose reports and durable decisions, and change rules, the
//     principal it forwards being recorded as "PRINCIPAL via NAME" (NAME
//     from its certificate) so that it cannot pass for another; it may not
//     add voters, propose other commands (rules of the lease machine,
//     takeovers, ticks, rule-store entries with a principal of its
//     choosing), or reach the Raft port.
// A refused call is counted (Group.Refused), logged at warn, and answered
// with codes.PermissionDenied (codes.Unauthenticated without a
// certificate).

// maxRPCBytes caps a forwarding message in either direction.
const maxRPCBytes = lease.MaxEntryBytes + 1024

// Refused is the number of callers the forwarding service and the Raft
// port refused (see Config.VoterNames).
func (g *Group) Refused() uint64 { return g.refused.Load() }

// voterNames is the set of certificate names a voter may carry.
func voterNames(cfg Config) map[string]bool {
	out := map[string]bool{}
	for _, n := range cfg.VoterNames {
		out[n] = true
	}
	if len(cfg.VoterNames) == 0 {
		for _, v := range cfg.Voters {
			out[v.Name] = true
		}
	}
	return out
}

// certNames lists a certificate's subject common name and DNS names.
func certNames(c *x509.Certificate) []string {
	var out []string
	if c.Subject.CommonName != "" {
		out = append(out, c.Subject.CommonName)
	}
	return append(out, c.DNSNames...)
}

// caller is who called the forwarding service.
type caller struct {
	verified bool   // a verified client certificate (or no TLS at all)
	voter    bool   // it may do everything
	name     string // its certificate's first name, "" without TLS
}

// tlsCaller classifies a connection's verified certificate.
func tlsCaller(st tls.ConnectionState, voters map[string]bool) caller {
	if len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return caller{}
	}
	names := certNames(st.VerifiedChains[0][0])
	c := caller{verified: true}
	for _, n := range names {
		if voters[n] {
			return caller{verified: true, voter: true, name: n}
		}
	}
	if len(names) > 0 {
		c.name = names[0]
	}
	return c
}

// caller returns who made the call in ctx.
func (s *rpcServer) caller(ctx context.Context) caller {
	if s.g.cfg.ServerTLS == nil {
		return caller{verified: true, voter: true}
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return caller{}
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return caller{}
	}
	return tlsCaller(info.State, s.voters)
}

// door refuses, with ServerTLS, every call (whatever its method, Durable
// included) from a caller without a verified client certificate: with
// tls.VerifyClientCertIfGiven the handshake lets such a caller through.
func (s *rpcServer) door(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if c := s.caller(ctx); !c.verified {
		return nil, s.refuse(ctx, c, info.FullMethod, "no verified certificate")
	}
	return h(ctx, req)
}

// refuse counts, logs and answers a call the doors keep shut.
func (s *rpcServer) refuse(ctx context.Context, c caller, method, why string) error {
	s.g.refused.Add(1)
	remote := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		remote = p.Addr.String()
	}
	s.g.log.Warn("forwarding call refused", "method", method, "remote", remote, "cert", c.name, "why", why)
	if !c.verified {
		return status.Errorf(codes.Unauthenticated, "lease: %s: a verified client certificate is required", method)
	}
	return status.Errorf(codes.PermissionDenied, "lease: %s: %s", method, why)
}

// gatewayEntry reports whether a caller that is not a voter may propose e:
// what a lease Client sends (a region's report, a durable decision).
func gatewayEntry(e lease.Entry) bool {
	switch {
	case e.Durable != nil:
		return e.Command == nil && e.Rule == nil
	case e.Command != nil:
		return e.Rule == nil && e.Command.Report != nil
	}
	return false
}

// viaPrincipal is the principal recorded for a change a gateway forwards:
// what it says, and the name its certificate proves.
func viaPrincipal(principal, name string) string {
	suffix := " via " + name
	if len(principal)+len(suffix) > lease.MaxPrincipalBytes {
		// Cut the claimed part, never the proven one.
		principal = truncateUTF8(principal, max(0, lease.MaxPrincipalBytes-len(suffix)))
	}
	return principal + suffix
}

// truncateUTF8 cuts s to at most n bytes on a rune boundary.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// rpcServer is the LeaseGroup service of one Group.
type rpcServer struct {
	grouppb.UnimplementedLeaseGroupServer
	g         *Group
	voters    map[string]bool
	lis       net.Listener
	srv       *grpc.Server
	serveDone chan struct{}
}

func startRPCServer(g *Group) (*rpcServer, error) {
	lis := g.cfg.RPCListener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", g.cfg.RPCAddr); err != nil {
			return nil, fmt.Errorf("lease: Config.RPCAddr: %w", err)
		}
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRPCBytes),
		grpc.MaxSendMsgSize(maxRPCBytes),
		grpc.WaitForHandlers(true), // stop returns with no handler running
	}
	s := &rpcServer{g: g, voters: voterNames(g.cfg), lis: lis, serveDone: make(chan struct{})}
	if g.cfg.ServerTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(g.cfg.ServerTLS)), grpc.ChainUnaryInterceptor(s.door))
	}
	opts = append(opts, g.cfg.ServerOptions...)
	s.srv = grpc.NewServer(opts...)
	grouppb.RegisterLeaseGroupServer(s.srv, s)
	go func() {
		defer close(s.serveDone)
		if err := s.srv.Serve(lis); err != nil {
			g.log.Error("forwarding server stopped", "err", err)
		}
	}()
	return s, nil
}

func (s *rpcServer) addr() string { return s.lis.Addr().String() }

// stop stops the server gracefully, cancelling calls still running after
// grace, and returns once it no longer serves.
func (s *rpcServer) stop(grace time.Duration) {
	graceful := make(chan struct{})
	go func() {
		s.srv.GracefulStop()
		close(graceful)
	}()
	t := time.NewTimer(grace)
	select {
	case <-graceful:
		t.Stop()
	case <-t.C:
		s.srv.Stop()
		<-graceful
	}
	<-s.serveDone
}

// Propose implements grouppb.LeaseGroupServer.
func (s *rpcServer) Propose(ctx context.Context, req *grouppb.ProposeRequest) (*grouppb.ProposeReply, error) {
	c := s.caller(ctx)
	if !c.verified {
		return nil, s.refuse(ctx, c, "Propose", "no verified certificate")
	}
	e, err := lease.EntryFromPB(req.GetCommand())
	if err != nil {
		s.g.malformed.Add(1)
		s.g.log.Debug("malformed forwarded command refused", "from", req.GetFrom(), "err", err)
		return &grouppb.ProposeReply{Code: grouppb.Code_BAD_COMMAND, Message: fmt.Sprintf("%v: %v", lease.ErrBadCommand, err)}, nil
	}
	if !c.voter && !gatewayEntry(e) {
		return nil, s.refuse(ctx, c, "Propose", "only a voter may propose this command; a gateway proposes reports and durable decisions")
	}
	l := s.g.lead()
	if l == nil {
		return &grouppb.ProposeReply{Code: grouppb.Code_NOT_LEADER, Message: ErrNotLeader.Error()}, nil
	}
	resp, _, err := s.g.proposeLocal(ctx, l, e)
	return proposeReply(resp, err), nil
}

// proposeReply is the wire form of an applied entry's response.
func proposeReply(resp lease.ApplyResponse, err error) *grouppb.ProposeReply {
	if err != nil {
		return &grouppb.ProposeReply{Code: errorCode(err), Message: err.Error(), Problems: problemsToPB(err)}
	}
	rep := &grouppb.ProposeReply{Result: resultToPB(resp.Result), RuleVersion: resp.RuleVersion}
	if resp.Durable != (bucket.Decision{}) { // a durable decision's Limit is at least 1
		rep.Durable = decisionToPB(resp.Durable)
	}
	return rep
}

// problemsToPB lists the *quota.Error values in err.
func problemsToPB(err error) []*grouppb.Problem {
	var out []*grouppb.Problem
	for _, q := range lease.Problems(err) {
		out = append(out, &grouppb.Problem{Field: q.Field, Message: q.Msg, RuleId: q.RuleID})
	}
	return out
}

// ChangeRule implements grouppb.LeaseGroupServer: the receiver puts or
// deletes the rule through Group.PutRule or DeleteRule, which forward to
// the leader when it does not lead.
func (s *rpcServer) ChangeRule(ctx context.Context, req *grouppb.ChangeRuleRequest) (*grouppb.ProposeReply, error) {
	c := s.caller(ctx)
	if !c.verified || (!c.voter && c.name == "") {
		return nil, s.refuse(ctx, c, "ChangeRule", "a certificate with a name is required")
	}
	// A voter's principal is its own admin API's; a gateway's is marked
	// with the name its certificate proves.
	principal := func(p string) string {
		if c.voter {
			return p
		}
		return viaPrincipal(p, c.name)
	}
	var (
		v   uint64
		err error
	)
	switch ch := req.GetChange().(type) {
	case *grouppb.ChangeRuleRequest_Put:
		var r quota.Rule
		if r, err = lease.DecodeRuleJSON(ch.Put.GetRule()); err != nil {
			s.g.malformed.Add(1)
			return &grouppb.ProposeReply{Code: grouppb.Code_BAD_COMMAND, Message: fmt.Sprintf("%v: put: %v", lease.ErrBadCommand, err)}, nil
		}
		v, err = s.g.putRule(ctx, principal(ch.Put.GetPrincipal()), r, ch.Put.GetRequestId())
	case *grouppb.ChangeRuleRequest_Delete:
		v, err = s.g.deleteRule(ctx, principal(ch.Delete.GetPrincipal()), ch.Delete.GetId(), ch.Delete.GetRequestId())
	default:
		s.g.malformed.Add(1)
		return &grouppb.ProposeReply{Code: grouppb.Code_BAD_COMMAND, Message: fmt.Sprintf("%v: no rule change", lease.ErrBadCommand)}, nil
	}
	return proposeReply(lease.ApplyResponse{RuleVersion: v}, err), nil
}

// ReadRules implements grouppb.LeaseGroupServer.
func (s *rpcServer) ReadRules(ctx context.Context, req *grouppb.ReadRulesRequest) (*grouppb.ReadRulesReply, error) {
	if c := s.caller(ctx); !c.verified {
		return nil, s.refuse(ctx, c, "ReadRules", "no verified certificate")
	}
	q := readQuery{linearizable: req.GetLinearizable(), rules: req.GetWithRules(), history: req.GetWithHistory(),
		since: req.GetSince(), limit: int(min(req.GetLimit(), MaxHistoryLimit))}
	var (
		v   lease.RuleView
		err error
	)
	if q.linearizable && req.GetForwarded() {
		// A voter forwarded it here as to the leader: answer or refuse,
		// never forward again.
		l := s.g.lead()
		if l == nil {
			return &grouppb.ReadRulesReply{Code: grouppb.Code_NOT_LEADER, Message: ErrNotLeader.Error()}, nil
		}
		v, _, err = s.g.readLeader(ctx, l, q)
	} else {
		v, err = s.g.read(ctx, q)
	}
	if err != nil {
		return &grouppb.ReadRulesReply{Code: errorCode(err), Message: err.Error()}, nil
	}
	return viewToPB(v)
}

// viewToPB converts a read of the rule store.
func viewToPB(v lease.RuleView) (*grouppb.ReadRulesReply, error) {
	rep := &grouppb.ReadRulesReply{Version: v.Version, Oldest: v.Oldest}
	for _, r := range v.Rules {
		b, err := lease.EncodeRuleJSON(r)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "lease: %v", err)
		}
		rep.Rules = append(rep.Rules, b)
	}
	for _, e := range v.History {
		rep.History = append(rep.History, &grouppb.AuditEntry{Version: e.Version, At: e.At, Principal: e.Principal,
			Op: e.Op.String(), RuleId: e.RuleID, Before: e.Before, After: e.After, Digest: e.Digest, RequestId: e.RequestID})
	}
	return rep, nil
}

// viewFromPB converts a wire read of the rule store, checking its form.
func viewFromPB(rep *grouppb.ReadRulesReply) (lease.RuleView, error) {
	v := lease.RuleView{Version: rep.GetVersion(), Oldest: rep.GetOldest()}
	for i, b := range rep.GetRules() {
		r, err := lease.DecodeRuleJSON(b)
		if err != nil {
			return lease.RuleView{}, fmt.Errorf("rule %d: %w", i, err)
		}
		v.Rules = append(v.Rules, r)
	}
	for i, e := range rep.GetHistory() {
		op, ok := lease.ParseRuleOp(e.GetOp())
		if !ok {
			return lease.RuleView{}, fmt.Errorf("history entry %d: unknown op %q", i, e.GetOp())
		}
		a := lease.AuditEntry{Version: e.GetVersion(), At: e.GetAt(), Principal: e.GetPrincipal(), RequestID: e.GetRequestId(), Op: op, RuleID: e.GetRuleId(),
			Before: e.GetBefore(), After: e.GetAfter(), Digest: e.GetDigest()}
		if len(a.Before) == 0 {
			a.Before = nil
		}
		if len(a.After) == 0 {
			a.After = nil
		}
		if _, _, err := a.Rules(); err != nil {
			return lease.RuleView{}, err
		}
		v.History = append(v.History, a)
	}
	return v, nil
}

// AddVoter implements grouppb.LeaseGroupServer.
func (s *rpcServer) AddVoter(ctx context.Context, req *grouppb.AddVoterRequest) (*grouppb.AddVoterReply, error) {
	if c := s.caller(ctx); !c.voter {
		return nil, s.refuse(ctx, c, "AddVoter", "only a voter may change the membership")
	}
	if req.GetName() == "" || req.GetAddress() == "" {
		return &grouppb.AddVoterReply{Code: grouppb.Code_BAD_COMMAND, Message: "lease: AddVoter: empty name or address"}, nil
	}
	if !s.g.IsLeader() {
		return &grouppb.AddVoterReply{Code: grouppb.Code_NOT_LEADER, Message: ErrNotLeader.Error()}, nil
	}
	if _, err := s.g.addVoterLocal(ctx, req.GetName(), req.GetAddress()); err != nil {
		return &grouppb.AddVoterReply{Code: errorCode(err), Message: err.Error()}, nil
	}
	return &grouppb.AddVoterReply{}, nil
}

// errorCode classifies an error for the wire.
func errorCode(err error) grouppb.Code {
	switch {
	case errors.Is(err, quota.ErrInvalidRule):
		return grouppb.Code_INVALID_RULE
	case errors.Is(err, lease.ErrRuleNotFound):
		return grouppb.Code_NOT_FOUND
	case errors.Is(err, lease.ErrUnknownRule):
		return grouppb.Code_UNKNOWN_RULE
	case errors.Is(err, lease.ErrUnknownRegion):
		return grouppb.Code_UNKNOWN_REGION
	case errors.Is(err, lease.ErrBadCommand), errors.Is(err, lease.ErrMalformedEntry):
		return grouppb.Code_BAD_COMMAND
	case errors.Is(err, ErrNotLeader), errors.Is(err, ErrClosed), errors.Is(err, ErrNoLeader):
		// A closing leader is, to the caller, one that no longer leads.
		return grouppb.Code_NOT_LEADER
	}
	return grouppb.Code_FAILED
}

// remoteError is an error the leader returned: its message, and the
// sentinel its code stands for.
type remoteError struct {
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

// ErrRemote is wrapped by a failure on the leader that has no other
// sentinel (code FAILED).
var ErrRemote = errors.New("lease: the leader failed the request")

// codeError turns a reply's code, message and problems back into an error;
// retry is true for NOT_LEADER. INVALID_RULE gives the problems back as
// *quota.Error values.
func codeError(leader string, code grouppb.Code, msg string, problems []*grouppb.Problem) (retry bool, err error) {
	var sentinel error
	switch code {
	case grouppb.Code_OK:
		return false, nil
	case grouppb.Code_INVALID_RULE:
		sentinel = quota.ErrInvalidRule
		if len(problems) > 0 {
			errs := make([]error, len(problems))
			for i, p := range problems {
				errs[i] = &quota.Error{Field: p.GetField(), Msg: p.GetMessage(), RuleID: p.GetRuleId(), Err: quota.ErrInvalidRule}
			}
			sentinel = errors.Join(errs...)
		}
	case grouppb.Code_NOT_FOUND:
		sentinel = lease.ErrRuleNotFound
	case grouppb.Code_BAD_COMMAND:
		sentinel = lease.ErrBadCommand
	case grouppb.Code_UNKNOWN_RULE:
		sentinel = lease.ErrUnknownRule
	case grouppb.Code_UNKNOWN_REGION:
		sentinel = lease.ErrUnknownRegion
	case grouppb.Code_NOT_LEADER:
		return true, fmt.Errorf("%w: %q answered: %s", ErrNotLeader, leader, msg)
	default:
		sentinel = ErrRemote
	}
	return false, &remoteError{msg: fmt.Sprintf("lease: leader %q: %s", leader, msg), sentinel: sentinel}
}

// forwardPropose sends e to the leader's forwarding service.
func (g *Group) forwardPropose(ctx context.Context, leader, addr string, e lease.Entry) (lease.ApplyResponse, bool, error) {
	pc, err := lease.EntryToPB(e)
	if err != nil {
		return lease.ApplyResponse{}, false, err
	}
	cc, err := g.conn(addr)
	if err != nil {
		return lease.ApplyResponse{}, false, err
	}
	rep, err := grouppb.NewLeaseGroupClient(cc).Propose(ctx, &grouppb.ProposeRequest{From: g.cfg.Name, Command: pc})
	if err != nil {
		return lease.ApplyResponse{}, callRetryable(ctx, err), fmt.Errorf("lease: forwarding to the leader %q at %s: %w", leader, addr, err)
	}
	if e.Durable != nil && rep.GetCode() == grouppb.Code_OK && rep.GetDurable() == nil {
		return lease.ApplyResponse{}, false, fmt.Errorf("leader %q: %w", leader, errDurableNoDecision)
	}
	return replyResponse(leader, rep)
}

// replyResponse turns a ProposeReply back into a response or an error.
func replyResponse(from string, rep *grouppb.ProposeReply) (lease.ApplyResponse, bool, error) {
	if retry, err := codeError(from, rep.GetCode(), rep.GetMessage(), rep.GetProblems()); err != nil {
		return lease.ApplyResponse{}, retry, err
	}
	res, err := resultFromPB(rep.GetResult())
	if err != nil {
		return lease.ApplyResponse{}, false, fmt.Errorf("lease: malformed reply from %q: %w", from, err)
	}
	resp := lease.ApplyResponse{Result: res, RuleVersion: rep.GetRuleVersion()}
	if rep.GetDurable() != nil {
		resp.Durable = decisionFromPB(rep.GetDurable())
	}
	return resp, false, nil
}

// forwardRead sends a linearizable read to the leader's forwarding service.
func (g *Group) forwardRead(ctx context.Context, leader, addr string, q readQuery) (lease.RuleView, bool, error) {
	cc, err := g.conn(addr)
	if err != nil {
		return lease.RuleView{}, false, err
	}
	rep, err := grouppb.NewLeaseGroupClient(cc).ReadRules(ctx, q.toPB(true))
	if err != nil {
		return lease.RuleView{}, callRetryable(ctx, err), fmt.Errorf("lease: forwarding a read to the leader %q at %s: %w", leader, addr, err)
	}
	if retry, err := codeError(leader, rep.GetCode(), rep.GetMessage(), nil); err != nil {
		return lease.RuleView{}, retry, err
	}
	v, err := viewFromPB(rep)
	if err != nil {
		return lease.RuleView{}, false, fmt.Errorf("lease: malformed reply from the leader %q: %w", leader, err)
	}
	return v, false, nil
}

// forwardAddVoter sends an AddVoter to the leader's forwarding service.
func (g *Group) forwardAddVoter(ctx context.Context, leader, addr, name, raftAddr string) (bool, error) {
	cc, err := g.conn(addr)
	if err != nil {
		return false, err
	}
	rep, err := grouppb.NewLeaseGroupClient(cc).AddVoter(ctx, &grouppb.AddVoterRequest{Name: name, Address: raftAddr})
	if err != nil {
		return callRetryable(ctx, err), fmt.Errorf("lease: forwarding to the leader %q at %s: %w", leader, addr, err)
	}
	return codeError(leader, rep.GetCode(), rep.GetMessage(), nil)
}

// callRetryable reports whether a failed call may pass on another attempt:
// the leader was unreachable or went away, and ctx has time left.
func callRetryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}

// conn returns the cached connection to a forwarding address, creating it
// on first use (gRPC connects on the first call).
func (g *Group) conn(addr string) (*grpc.ClientConn, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, ErrClosed
	}
	if cc := g.conns[addr]; cc != nil {
		return cc, nil
	}
	creds := insecure.NewCredentials()
	if g.cfg.ClientTLS != nil {
		creds = credentials.NewTLS(g.cfg.ClientTLS)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRPCBytes), grpc.MaxCallSendMsgSize(maxRPCBytes)),
	}, g.cfg.DialOptions...)
	// No idleness: every goroutine of the connection descends from
	// NewClient, under the label Close waits on.
	opts = append(opts, grpc.WithIdleTimeout(0))
	var cc *grpc.ClientConn
	var err error
	golabel.Do(g.label, func() { cc, err = grpc.NewClient("passthrough:///"+addr, opts...) })
	if err != nil {
		return nil, fmt.Errorf("lease: forwarding address %q: %w", addr, err)
	}
	g.conns[addr] = cc
	return cc, nil
}

// raftStream is the Raft transport's StreamLayer: plain TCP without
// ServerTLS; with it, mutual TLS (ClientTLS dialling) on which the
// accepting side serves only a verified certificate that names a voter.
func (g *Group) raftStream(lis net.Listener, dial func(addr string, timeout time.Duration) (net.Conn, error)) raft.StreamLayer {
	if g.cfg.ServerTLS == nil {
		return tcpStream{Listener: lis, dial: dial}
	}
	srv := g.cfg.ServerTLS.Clone()
	srv.ClientAuth = tls.RequireAndVerifyClientCert // Raft peers are voters
	cli := &tls.Config{MinVersion: tls.VersionTLS12}
	if g.cfg.ClientTLS != nil {
		cli = g.cfg.ClientTLS.Clone()
	}
	return &tlsStream{Listener: lis, server: srv, client: cli, voters: voterNames(g.cfg), g: g, dial: dial}
}

// tlsStream is raft's StreamLayer over mutual TLS.
type tlsStream struct {
	net.Listener
	server, client *tls.Config
	voters         map[string]bool
	g              *Group
	dial           func(addr string, timeout time.Duration) (net.Conn, error) // nil: net.Dialer
}

// raftHandshakeTimeout bounds an accepted connection's TLS handshake.
const raftHandshakeTimeout = 10 * time.Second

// Accept implements raft.StreamLayer. The handshake and the voter check run
// on the connection's first read or write, in the transport's goroutine
// for the connection, so that a slow or hostile peer cannot hold up the
// accept loop.
func (s *tlsStream) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &voterConn{Conn: tls.Server(c, s.server), s: s}, nil
}

// Dial implements raft.StreamLayer.
func (s *tlsStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	cfg := s.client
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(string(addr))
		if err != nil {
			return nil, fmt.Errorf("lease: raft address %q: %w", addr, err)
		}
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	if s.dial == nil {
		return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(addr), cfg)
	}
	raw, err := s.dial(string(addr), timeout)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return c, nil
}

// voterConn is an accepted Raft connection checked once, before any byte
// passes, to carry a voter's certificate.
type voterConn struct {
	*tls.Conn
	s    *tlsStream
	once sync.Once
	err  error
}

func (c *voterConn) check() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), raftHandshakeTimeout)
		defer cancel()
		why := ""
		cl := caller{}
		if err := c.HandshakeContext(ctx); err != nil {
			why = err.Error()
		} else if cl = tlsCaller(c.ConnectionState(), c.s.voters); !cl.voter {
			why = "the certificate names no voter"
		}
		if why == "" {
			return
		}
		c.s.g.refused.Add(1)
		c.s.g.log.Warn("raft connection refused", "remote", c.RemoteAddr().String(), "cert", cl.name, "why", why)
		c.err = fmt.Errorf("lease: raft connection from %s refused: %s", c.RemoteAddr(), why)
		_ = c.Conn.Close()
	})
	return c.err
}

// Read implements net.Conn.
func (c *voterConn) Read(b []byte) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

// Write implements net.Conn.
func (c *voterConn) Write(b []byte) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}
