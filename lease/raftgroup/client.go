package raftgroup

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/weir-dev/weir/internal/golabel"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/leasepb"
	"github.com/weir-dev/weir/lease/raftgroup/grouppb"
	"github.com/weir-dev/weir/quota"
)

// This file is the rule store's client for a node that is not a voter: it
// calls any voter's forwarding service (ChangeRule, ReadRules), and the
// voter forwards writes and linearizable reads to the leader as its own
// Group methods do.

// ClientConfig configures a Client. Voters is required; the zero value of
// every other field works.
type ClientConfig struct {
	// Voters are the voters' forwarding addresses (Config.RPCAddr),
	// host:port. The client calls one, and moves to the next when it is
	// unreachable or has no leader to forward to.
	Voters []string
	// Name identifies the client in the voters' logs.
	Name string
	// TLS secures the calls; nil means plaintext. A voter whose ServerTLS
	// requires client certificates needs one here.
	TLS *tls.Config
	// DialOptions are added to every connection's options.
	DialOptions []grpc.DialOption
	// Timeout bounds a call whose ctx has no deadline; 0 means
	// DefaultProposeTimeout.
	Timeout time.Duration
}

// Client reads and changes the lease group's rule store from a node that
// is not a voter. Its methods are safe for concurrent use.
//
// The voters' forwarding service trusts the principal a client names: it
// is the admin API's (AdminHandler's) job to authenticate, and the
// service's to admit only trusted callers (ServerTLS with
// tls.RequireAndVerifyClientCert).
type Client struct {
	cfg   ClientConfig
	conns []*grpc.ClientConn
	next  atomic.Int64 // the voter that answered last

	mu     sync.Mutex
	closed bool

	// label marks the connections' goroutines (internal/golabel): Close
	// waits for them, as ClientConn.Close does not for all of them.
	label string
}

// NewClient returns a client of the voters in cfg. It does not connect:
// the first call does.
func NewClient(cfg ClientConfig) (*Client, error) {
	if len(cfg.Voters) == 0 {
		return nil, errors.New("lease: ClientConfig.Voters is empty")
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("lease: ClientConfig.Timeout is negative (%v)", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultProposeTimeout
	}
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	c := &Client{cfg: cfg, label: golabel.New("lease-client")}
	for i, addr := range cfg.Voters {
		if addr == "" {
			c.closeConns()
			return nil, fmt.Errorf("lease: ClientConfig.Voters[%d] is empty", i)
		}
		opts := append([]grpc.DialOption{
			grpc.WithTransportCredentials(creds),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRPCBytes), grpc.MaxCallSendMsgSize(maxRPCBytes)),
		}, cfg.DialOptions...)
		// No idleness: every goroutine of the connection descends from
		// NewClient, under the label Close waits on.
		opts = append(opts, grpc.WithIdleTimeout(0))
		var cc *grpc.ClientConn
		var err error
		golabel.Do(c.label, func() { cc, err = grpc.NewClient("passthrough:///"+addr, opts...) })
		if err != nil {
			c.closeConns()
			return nil, fmt.Errorf("lease: ClientConfig.Voters[%d] %q: %w", i, addr, err)
		}
		c.conns = append(c.conns, cc)
	}
	return c, nil
}

// Close closes the connections and returns once their goroutines have
// ended. Calls after it fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.closeConns()
}

func (c *Client) closeConns() error {
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	if n := golabel.Wait(c.label, closeWait); n > 0 {
		errs = append(errs, fmt.Errorf("lease: %d goroutines of the client's connections still running %v after close", n, closeWait))
	}
	return errors.Join(errs...)
}

// PutRule implements RuleService through a voter. The rule is validated
// here first, so an invalid one costs no round trip. Every attempt, on any
// voter, carries the same request id, so a put retried after a lost reply
// is applied once.
func (c *Client) PutRule(ctx context.Context, principal string, r quota.Rule) (uint64, error) {
	reqID := newRequestID()
	if err := (lease.RuleChange{Principal: principal, Put: &r}).Validate(); err != nil {
		return 0, err
	}
	b, err := lease.EncodeRuleJSON(r)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", lease.ErrBadCommand, err)
	}
	return c.change(ctx, &grouppb.ChangeRuleRequest{From: c.cfg.Name,
		Change: &grouppb.ChangeRuleRequest_Put{Put: &leasepb.RulePut{Principal: principal, Rule: b, RequestId: reqID}}})
}

// DeleteRule implements RuleService through a voter, under one request id
// like PutRule: a delete retried after a lost reply returns its version.
func (c *Client) DeleteRule(ctx context.Context, principal, id string) (uint64, error) {
	if id == "" {
		return 0, fmt.Errorf("%w: DeleteRule with an empty id", lease.ErrBadCommand)
	}
	if err := (lease.RuleChange{Principal: principal, Delete: id}).Check(); err != nil {
		return 0, err
	}
	return c.change(ctx, &grouppb.ChangeRuleRequest{From: c.cfg.Name,
		Change: &grouppb.ChangeRuleRequest_Delete{Delete: &leasepb.RuleDelete{Principal: principal, Id: id, RequestId: newRequestID()}}})
}

func (c *Client) change(ctx context.Context, req *grouppb.ChangeRuleRequest) (uint64, error) {
	var v uint64
	err := c.do(ctx, "rule change", func(ctx context.Context, cc *grpc.ClientConn, addr string) (bool, error) {
		rep, err := grouppb.NewLeaseGroupClient(cc).ChangeRule(ctx, req)
		if err != nil {
			return callRetryable(ctx, err), fmt.Errorf("lease: voter %s: %w", addr, err)
		}
		resp, retry, err := replyResponse("voter "+addr, rep)
		v = resp.RuleVersion
		return retry, err
	})
	return v, err
}

// ReadRules implements RuleService: from the replica of the voter reached,
// or, when linearizable, from the leader (the voter forwards the read).
func (c *Client) ReadRules(ctx context.Context, linearizable bool) (uint64, []quota.Rule, error) {
	v, err := c.read(ctx, readQuery{linearizable: linearizable, rules: true})
	return v.Version, v.Rules, err
}

// ReadHistory implements RuleService, like ReadRules.
func (c *Client) ReadHistory(ctx context.Context, q HistoryQuery) (HistoryPage, error) {
	v, err := c.read(ctx, readQuery{linearizable: q.Linearizable, history: true, since: q.Since, limit: historyLimit(q.Limit)})
	if err != nil {
		return HistoryPage{}, err
	}
	return HistoryPage{Version: v.Version, Oldest: v.Oldest, Entries: v.History}, nil
}

func (c *Client) read(ctx context.Context, q readQuery) (lease.RuleView, error) {
	var v lease.RuleView
	err := c.do(ctx, "read", func(ctx context.Context, cc *grpc.ClientConn, addr string) (bool, error) {
		rep, err := grouppb.NewLeaseGroupClient(cc).ReadRules(ctx, q.toPB(false))
		if err != nil {
			return callRetryable(ctx, err), fmt.Errorf("lease: voter %s: %w", addr, err)
		}
		if retry, err := codeError("voter "+addr, rep.GetCode(), rep.GetMessage(), nil); err != nil {
			return retry, err
		}
		if v, err = viewFromPB(rep); err != nil {
			return false, fmt.Errorf("lease: malformed reply from voter %s: %w", addr, err)
		}
		return false, nil
	})
	return v, err
}

// do calls once on a voter, starting with the one that answered last, and
// moves to the next while the failure is retryable (unreachable, no
// leader), pausing after every voter was tried, until ctx (bounded by
// Timeout) ends.
func (c *Client) do(ctx context.Context, what string, once func(context.Context, *grpc.ClientConn, string) (bool, error)) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	n := int64(len(c.conns))
	start := c.next.Load()
	wait := 5 * time.Millisecond
	for attempt := int64(0); ; attempt++ {
		i := (start + attempt) % n
		retry, err := once(ctx, c.conns[i], c.cfg.Voters[i])
		if err == nil {
			c.next.Store(i)
			return nil
		}
		if !retry {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("lease: %s gave up: %w (%w)", what, err, ctx.Err())
		}
		if (attempt+1)%n != 0 {
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("lease: %s gave up: %w (%w)", what, err, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// Report sends a region's Report through a voter and returns the grants,
// like Group.Propose with Command{Report: &r}: the voter reached proposes
// it when it leads and answers NOT_LEADER otherwise, and the client then
// moves on to the next voter until it reaches the leader (or ctx, bounded
// by Timeout, ends). Every attempt carries the same report, so a retry
// after a lost reply is applied once (the machine ignores a Seq it has
// applied and returns the current leases).
func (c *Client) Report(ctx context.Context, r lease.Report) (lease.Result, error) {
	pc, err := lease.EntryToPB(lease.Entry{Command: &lease.Command{Report: &r}})
	if err != nil {
		return lease.Result{}, err
	}
	req := &grouppb.ProposeRequest{From: c.cfg.Name, Command: pc}
	var res lease.Result
	err = c.do(ctx, "report", func(ctx context.Context, cc *grpc.ClientConn, addr string) (bool, error) {
		rep, err := grouppb.NewLeaseGroupClient(cc).Propose(ctx, req)
		if err != nil {
			return callRetryable(ctx, err), fmt.Errorf("lease: voter %s: %w", addr, err)
		}
		resp, retry, err := replyResponse("voter "+addr, rep)
		res = resp.Result
		return retry, err
	})
	return res, err
}
