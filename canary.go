package weir

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// CanaryConfig turns on the enforcement canary: the node probes a rule with
// a tiny limit a few times a second under its own identity and reports
// whether it still sees rejections (weir_canary_ok). A limiter whose
// enforcement silently stopped (the rule shadowed or removed, a rule set
// that never arrived, a bug) admits every probe, and the gauge drops to 0.
//
// The rule is an ordinary rule of the rule set, for example
//
//	rules:
//	  - id: weir-canary
//	    key: [header:X-Weir-Canary]
//	    match: {path: /weir-canary}
//	    limit: 1
//	    window: 1s
//	    burst: 1
//
// which no real request reaches. Probes go through Node.Check, so they take
// the same path as real decisions (the cluster's owner for a shared rule)
// and show in that rule's weir_decisions_total.
type CanaryConfig struct {
	// Rule is the id of the canary rule; required.
	Rule string
	// Identity is the key the node probes under; empty means "canary:"
	// plus the node's cluster name (or "canary:node" without a cluster),
	// so every node has a bucket of its own.
	Identity string
	// Interval is the time between probes; zero means 250ms (4 a second,
	// so a rule of 1 a second must reject about 3 of them).
	Interval time.Duration
	// Window is how long the node may go without seeing a rejection
	// before the canary reports not ok; zero means 5s. It must be longer
	// than a few probe intervals and than the rule's window.
	Window time.Duration
	// Timeout bounds one probe; zero means 1s.
	Timeout time.Duration
}

// Canary outcomes, the values of weir_canary_probes_total's outcome label.
const (
	CanaryAllowed  = "allowed"
	CanaryRejected = "rejected"
	// CanaryError is a probe that could not be decided: the rule is
	// missing from the rule set, or the node is closed.
	CanaryError = "error"
)

// canaryCore is the canary's pure part: probe outcomes in, a verdict out,
// time passed in. It is not safe for concurrent use.
type canaryCore struct {
	window     int64
	start      int64 // when probing started
	lastReject int64 // when a probe was last rejected; 0 never
	allowed    uint64
	rejected   uint64
	errors     uint64
}

// observe records one probe's outcome at now.
func (c *canaryCore) observe(now int64, outcome string) {
	switch outcome {
	case CanaryRejected:
		c.rejected++
		c.lastReject = now
	case CanaryAllowed:
		c.allowed++
	default:
		c.errors++
	}
}

// ok reports whether enforcement looks alive at now: a rejection was seen
// within the window. During the first window after the start nothing can be
// concluded yet and ok is true.
func (c *canaryCore) ok(now int64) bool {
	if now-c.start < c.window {
		return true
	}
	return c.lastReject != 0 && now-c.lastReject <= c.window
}

// CanaryStatus is the canary's state (ops.Canary).
type CanaryStatus struct {
	// Enabled is false when Config.Canary is nil; the rest is then zero.
	Enabled  bool   `json:"enabled"`
	Rule     string `json:"rule,omitempty"`
	Identity string `json:"identity,omitempty"`
	// OK is false when no probe was rejected within the window (after the
	// first window): enforcement may have stopped.
	OK bool `json:"ok"`
	// LastRejection is when a probe was last rejected (zero: never).
	LastRejection time.Time `json:"last_rejection,omitzero"`
	// Probes by outcome since the node started.
	Allowed  uint64 `json:"allowed"`
	Rejected uint64 `json:"rejected"`
	Errors   uint64 `json:"errors"`
	// LastError is the last probe's error, if it had one.
	LastError string `json:"last_error,omitempty"`
}

// canary is the shell: a ticker that probes, and the core under a mutex.
type canary struct {
	n        *Node
	cfg      CanaryConfig
	mu       sync.Mutex
	core     canaryCore
	lastErr  string
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// newCanary validates cfg and fills its defaults.
func newCanary(n *Node, cfg CanaryConfig) (*canary, error) {
	switch {
	case cfg.Rule == "":
		return nil, errors.New("weir: Config.Canary.Rule: required")
	case cfg.Interval < 0:
		return nil, fmt.Errorf("weir: Config.Canary.Interval: must not be negative, got %v", cfg.Interval)
	case cfg.Window < 0:
		return nil, fmt.Errorf("weir: Config.Canary.Window: must not be negative, got %v", cfg.Window)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("weir: Config.Canary.Timeout: must not be negative, got %v", cfg.Timeout)
	}
	if cfg.Interval == 0 {
		cfg.Interval = 250 * time.Millisecond
	}
	if cfg.Window == 0 {
		cfg.Window = 5 * time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Window < 2*cfg.Interval {
		return nil, fmt.Errorf("weir: Config.Canary.Window: %v is shorter than two probe intervals (%v)", cfg.Window, 2*cfg.Interval)
	}
	if cfg.Identity == "" {
		cfg.Identity = "canary:node"
		if n.cfg.Cluster != nil {
			cfg.Identity = "canary:" + n.cfg.Cluster.Name
		}
	}
	c := &canary{n: n, cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}
	c.core = canaryCore{window: int64(cfg.Window), start: n.now()}
	return c, nil
}

// run probes every Interval until close.
func (c *canary) run() {
	defer close(c.done)
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.probe()
		}
	}
}

// probe decides one canary request and feeds the outcome to the core.
func (c *canary) probe() {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	res, err := c.n.Check(ctx, c.cfg.Identity, c.cfg.Rule, 0)
	cancel()
	outcome := CanaryAllowed
	switch {
	case err != nil:
		outcome = CanaryError
	case !res.Allowed:
		outcome = CanaryRejected
	}
	now := c.n.now()
	c.mu.Lock()
	c.core.observe(now, outcome)
	if err != nil {
		c.lastErr = err.Error()
	} else {
		c.lastErr = ""
	}
	c.mu.Unlock()
}

// close stops probing and waits for the loop to end.
func (c *canary) close() {
	c.stopOnce.Do(func() { close(c.stop) })
	<-c.done
}

// status reports the canary's state at now.
func (c *canary) status(now int64) CanaryStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := CanaryStatus{Enabled: true, Rule: c.cfg.Rule, Identity: c.cfg.Identity, OK: c.core.ok(now),
		Allowed: c.core.allowed, Rejected: c.core.rejected, Errors: c.core.errors, LastError: c.lastErr}
	if c.core.lastReject != 0 {
		st.LastRejection = time.Unix(0, c.core.lastReject).UTC()
	}
	return st
}

// canaryStatus reports the enforcement canary's state (Config.Canary); Enabled is
// false without one.
func (n *Node) canaryStatus() CanaryStatus {
	if n.ops.canary == nil {
		return CanaryStatus{}
	}
	return n.ops.canary.status(n.now())
}
