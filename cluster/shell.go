package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Shell is the thin adapter around one node's Coordinator: it serialises
// calls into the core with a mutex, reads the clock, drives Tick with a
// ticker, sends what Ready returns through a Transport after a short linger
// (so that everything due to one peer travels in one batch), feeds replies
// and incoming batches back through Step, hands late decisions to the
// callers waiting for them, and keeps a circuit breaker per peer. All
// decisions are made by the Coordinator; the Shell only does I/O.
type Shell struct {
	cfg    ShellConfig
	log    *slog.Logger
	now    func() int64
	mu     sync.Mutex // guards coord, waits, breaks, busy
	coord  *Coordinator
	ring   atomic.Pointer[Ring]
	waits  map[uint64]chan Outcome
	breaks map[string]*breaker
	busy   map[string]*Message // peers with an exchange in flight, and what waits for the next
	queued bool

	flushC chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool

	sent, failed atomic.Uint64
}

// ShellConfig configures a Shell.
type ShellConfig struct {
	// Coordinator configures the core (Self is required).
	Coordinator CoordinatorConfig
	// Transport carries batches to peers. Required.
	Transport Transport
	// Linger is how long a batch waits for more items before it is sent;
	// zero means 200µs.
	Linger time.Duration
	// MaxBatch is the most items one exchange carries: a batch that
	// reaches it is sent at once, without waiting for the linger, and a
	// larger one (a leaving node's handoffs) is cut into several exchanges,
	// sent in order. Zero means 1024; at most MaxBatchItems.
	MaxBatch int
	// CallTimeout bounds one exchange with a peer; zero means 200ms.
	CallTimeout time.Duration
	// TickInterval is how often the core's Tick runs; zero means 10ms.
	TickInterval time.Duration
	// BreakerFailures consecutive failed exchanges open a peer's breaker
	// (its identities are then decided by on_failure); zero means 3.
	BreakerFailures int
	// BreakerCooldown is how long a breaker stays open before one trial
	// exchange; zero means 1s.
	BreakerCooldown time.Duration
	// Clock returns unix nanoseconds; nil means the system clock.
	Clock func() int64
	// Logger receives breaker changes; nil discards.
	Logger *slog.Logger
}

// breaker is one peer's circuit breaker.
type breaker struct {
	failures int
	openAt   int64 // 0 when closed
}

// NewShell starts a Shell around a new Coordinator.
func NewShell(cfg ShellConfig) (*Shell, error) {
	if cfg.Coordinator.Self == "" {
		return nil, errors.New("cluster: ShellConfig.Coordinator.Self: required")
	}
	if cfg.Transport == nil {
		return nil, errors.New("cluster: ShellConfig.Transport: required")
	}
	if cfg.Linger <= 0 {
		cfg.Linger = 200 * time.Microsecond
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1024
	}
	if cfg.MaxBatch > MaxBatchItems {
		return nil, fmt.Errorf("cluster: ShellConfig.MaxBatch: %d is more than the wire limit of %d items", cfg.MaxBatch, MaxBatchItems)
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 200 * time.Millisecond
	}
	if cfg.TickInterval <= 0 {
		cfg.TickInterval = 10 * time.Millisecond
	}
	if cfg.BreakerFailures <= 0 {
		cfg.BreakerFailures = 3
	}
	if cfg.BreakerCooldown <= 0 {
		cfg.BreakerCooldown = time.Second
	}
	if cfg.Clock == nil {
		base := time.Now()
		wall := base.UnixNano()
		cfg.Clock = func() int64 { return wall + int64(time.Since(base)) }
	}
	if cfg.Coordinator.Incarnation == 0 {
		cfg.Coordinator.Incarnation = uint64(cfg.Clock())
	}
	s := &Shell{
		cfg:    cfg,
		log:    cfg.Logger,
		now:    cfg.Clock,
		coord:  NewCoordinator(cfg.Coordinator),
		waits:  map[uint64]chan Outcome{},
		breaks: map[string]*breaker{},
		busy:   map[string]*Message{},
		flushC: make(chan struct{}, 1),
		stop:   make(chan struct{}),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.wg.Add(2)
	go s.ticker()
	go s.flusher()
	return s, nil
}

// SetRules installs the rules the core decides.
func (s *Shell) SetRules(rules []RuleParams) {
	s.mu.Lock()
	s.coord.SetRules(rules)
	s.mu.Unlock()
}

// SetRing installs a new ring (after a membership change).
func (s *Shell) SetRing(r *Ring) {
	s.mu.Lock()
	old := s.ring.Swap(r)
	s.coord.SetTable(s.now(), r)
	// A member that is back in the ring, or at a new address, is a new
	// run of that node (a restart): the failures its breaker counted were
	// the old run's, so its identities stop being decided by on_failure
	// at once instead of after the cooldown.
	for peer := range s.breaks {
		if i := r.IndexOf(peer); i >= 0 {
			if j := old.IndexOf(peer); j < 0 || old.Member(j).Addr != r.Member(i).Addr {
				s.peerOK(peer)
			}
		}
	}
	s.mu.Unlock()
	s.kick()
}

// Ring returns the ring in force.
func (s *Shell) Ring() *Ring { return s.ring.Load() }

// Decide decides one request. A decision the core cannot make locally waits
// for the owner's answer; the core's decide timeout bounds the wait (then
// on_failure decides), and so does ctx (then the request is decided by
// on_failure at once, and marked degraded).
func (s *Shell) Decide(ctx context.Context, ruleID, identity string, cost int64) (Outcome, error) {
	return s.DecideAt(ctx, s.now(), ruleID, identity, cost)
}

// DecideAt is Decide at a time the caller already read from the Shell's
// clock (ShellConfig.Clock), so that a request reads the clock once: outside
// the Shell's lock.
func (s *Shell) DecideAt(ctx context.Context, now int64, ruleID, identity string, cost int64) (Outcome, error) {
	s.mu.Lock()
	o, err := s.coord.Decide(now, ruleID, identity, cost)
	full := s.coord.Queued() >= s.cfg.MaxBatch
	if err != nil || !o.Pending {
		queued := s.coord.HasReady()
		s.mu.Unlock()
		if full {
			s.flush()
		} else if queued {
			s.kick()
		}
		return o, err
	}
	ch, _ := waitPool.Get().(chan Outcome)
	if ch == nil {
		ch = make(chan Outcome, 1)
	}
	s.waits[o.Ticket] = ch
	s.mu.Unlock()
	if full {
		s.flush()
	} else {
		s.kick()
	}
	select {
	case out := <-ch:
		waitPool.Put(ch)
		return out, nil
	case <-ctx.Done():
		s.mu.Lock()
		if _, waiting := s.waits[o.Ticket]; waiting {
			delete(s.waits, o.Ticket)
			waitPool.Put(ch) // nothing was or will be sent on it
		}
		s.mu.Unlock()
		return Outcome{}, ctx.Err()
	}
}

// waitPool recycles the channels on which pending requests wait for their
// owner's answer: one per forwarded decision otherwise. A channel goes back
// empty, and only once nothing can send on it any more.
var waitPool sync.Pool

// Refund gives back what Decide admitted for a request that did not go
// through after all (see Coordinator.Refund).
func (s *Shell) Refund(ruleID, identity string, cost int64, src Source) {
	s.mu.Lock()
	s.coord.Refund(s.now(), ruleID, identity, cost, src)
	s.mu.Unlock()
}

// kick asks the flusher to send after the linger.
func (s *Shell) kick() {
	select {
	case s.flushC <- struct{}{}:
	default:
	}
}

// Handle is the Transport Handler: it steps an incoming batch through the
// core and returns what the core has for the sender as the reply.
func (s *Shell) Handle(ctx context.Context, from string, m *Message) (*Message, error) {
	if s.closed.Load() {
		return nil, errors.New("cluster: node closed")
	}
	s.mu.Lock()
	s.coord.Step(s.now(), from, m)
	rd := s.coord.Ready()
	reply := &Message{}
	var others []Envelope
	for _, env := range rd.Messages {
		if env.To == from {
			// The reply carries one batch; anything beyond it follows
			// as exchanges of its own.
			parts := env.Msg.Split(s.cfg.MaxBatch)
			*reply = parts[0]
			if len(parts) > 1 {
				rest := parts[1]
				for _, p := range parts[2:] {
					rest.merge(&p)
				}
				others = append(others, Envelope{To: from, Msg: rest})
			}
		} else {
			others = append(others, env)
		}
	}
	s.complete(rd.Completions)
	s.mu.Unlock()
	for _, env := range others {
		s.send(env)
	}
	return reply, nil
}

// complete hands completions to their waiters (under mu).
func (s *Shell) complete(cs []Completion) {
	for _, c := range cs {
		if ch, ok := s.waits[c.Ticket]; ok {
			ch <- c.Outcome
			delete(s.waits, c.Ticket)
		}
	}
}

func (s *Shell) ticker() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.mu.Lock()
			now := s.now()
			s.coord.Tick(now)
			s.retryBreakers(now)
			s.mu.Unlock()
			s.flush()
		}
	}
}

func (s *Shell) flusher() {
	defer s.wg.Done()
	for {
		select {
		case <-s.stop:
			return
		case <-s.flushC:
			t := time.NewTimer(s.cfg.Linger)
			select {
			case <-s.stop:
				t.Stop()
				return
			case <-t.C:
			}
			s.flush()
		}
	}
}

// Flush reports every identity's unsent spend to its owner and waits for
// the exchanges (each bounded by CallTimeout): a node does it before it
// leaves, so that what it admitted is charged.
func (s *Shell) Flush() { s.flushWith(func(now int64) { s.coord.FlushAll(now) }) }

// Leave hands every bucket this node owns to its owner in the ring without
// this node, reports all unsent spend, and waits for the exchanges: the
// graceful half of leaving (the caller then leaves the membership).
func (s *Shell) Leave() {
	r := s.ring.Load()
	var rest []Member
	for _, m := range r.Members() {
		if m.Name != s.cfg.Coordinator.Self {
			rest = append(rest, m)
		}
	}
	next, err := NewRing(r.Epoch()+1, rest)
	if err != nil || next.Len() == 0 {
		s.Flush()
		return
	}
	s.flushWith(func(now int64) { s.coord.HandoffAll(now, next) })
}

func (s *Shell) flushWith(queue func(now int64)) {
	s.mu.Lock()
	queue(s.now())
	rd := s.coord.Ready()
	s.complete(rd.Completions)
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, env := range rd.Messages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, msg := range env.Msg.Split(s.cfg.MaxBatch) {
				ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CallTimeout)
				reply, err := s.cfg.Transport.Exchange(ctx, s.addrOf(env.To), &msg)
				cancel()
				s.sent.Add(1)
				if err != nil {
					s.failed.Add(1)
					return
				}
				if reply != nil && !reply.Empty() {
					s.mu.Lock()
					s.coord.Step(s.now(), env.To, reply)
					s.mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
}

// addrOf returns a member's peer address from the ring (its name if absent).
func (s *Shell) addrOf(name string) string {
	if r := s.ring.Load(); r != nil {
		if i := r.IndexOf(name); i >= 0 {
			return r.Member(i).Addr
		}
	}
	return name
}

// flush sends everything the core has queued, one exchange per peer.
func (s *Shell) flush() {
	s.mu.Lock()
	rd := s.coord.Ready()
	s.complete(rd.Completions)
	s.mu.Unlock()
	for _, env := range rd.Messages {
		s.send(env)
	}
}

// send exchanges one batch with a peer in its own goroutine and steps the
// reply back in. Failures feed the peer's breaker.
func (s *Shell) send(env Envelope) {
	// One exchange in flight per peer: what is due to a peer while one is
	// on its way waits and joins the next batch. Under load batches grow
	// instead of calls multiplying (each call costs a round trip's CPU on
	// both sides), and one peer's messages are stepped in the order they
	// were made.
	s.mu.Lock()
	if q, inflight := s.busy[env.To]; inflight {
		if q == nil {
			m := env.Msg
			s.busy[env.To] = &m
		} else {
			q.merge(&env.Msg)
		}
		s.mu.Unlock()
		return
	}
	s.busy[env.To] = nil
	s.mu.Unlock()
	addr := s.addrOf(env.To)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		msg := env.Msg
		for {
			for _, part := range msg.Split(s.cfg.MaxBatch) {
				if !s.exchange(env.To, addr, &part) {
					break // the rest of a failed batch is dropped, as a lost message
				}
			}
			s.mu.Lock()
			q := s.busy[env.To]
			if q == nil || s.closed.Load() {
				delete(s.busy, env.To)
				s.mu.Unlock()
				return
			}
			s.busy[env.To] = nil
			s.mu.Unlock()
			msg = *q
		}
	}()
}

// merge appends n's items to m's, keeping their order; n is the newer.
func (m *Message) merge(n *Message) {
	m.Epoch = n.Epoch
	m.Syncs = append(m.Syncs, n.Syncs...)
	m.Decides = append(m.Decides, n.Decides...)
	m.Acks = append(m.Acks, n.Acks...)
	m.Results = append(m.Results, n.Results...)
	m.Handoffs = append(m.Handoffs, n.Handoffs...)
	if n.HandedOver != 0 {
		m.HandedOver = n.HandedOver
	}
}

// exchange sends one batch, steps the reply in and sends what follows from
// it; it reports whether the exchange succeeded.
func (s *Shell) exchange(to, addr string, msg *Message) bool {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CallTimeout)
	defer cancel()
	reply, err := s.cfg.Transport.Exchange(ctx, addr, msg)
	s.sent.Add(1)
	s.mu.Lock()
	now := s.now()
	if err != nil {
		s.failed.Add(1)
		s.peerFailed(now, to, err)
	} else {
		s.peerOK(to)
		if reply != nil && !reply.Empty() {
			s.coord.Step(now, to, reply)
		}
	}
	rd := s.coord.Ready()
	s.complete(rd.Completions)
	s.mu.Unlock()
	if s.closed.Load() {
		return false
	}
	for _, e := range rd.Messages {
		s.send(e)
	}
	return err == nil
}

func (s *Shell) peerFailed(now int64, peer string, err error) {
	b := s.breaks[peer]
	if b == nil {
		b = &breaker{}
		s.breaks[peer] = b
	}
	b.failures++
	if b.failures >= s.cfg.BreakerFailures && b.openAt == 0 {
		b.openAt = now
		s.coord.SetPeerDown(now, peer, true)
		s.log.Warn("peer unreachable: its identities fall back to on_failure", "peer", peer, "err", err)
	}
}

func (s *Shell) peerOK(peer string) {
	b := s.breaks[peer]
	if b == nil {
		return
	}
	if b.openAt != 0 {
		s.coord.SetPeerDown(0, peer, false)
		s.log.Info("peer reachable again", "peer", peer)
	}
	delete(s.breaks, peer)
}

// retryBreakers lets a peer whose breaker cooled down be tried again: the
// next batch to it is the trial (under mu).
func (s *Shell) retryBreakers(now int64) {
	for peer, b := range s.breaks {
		if b.openAt != 0 && now-b.openAt >= int64(s.cfg.BreakerCooldown) {
			// Half-open: decisions go to the peer again; one more
			// failure reopens at once.
			s.coord.SetPeerDown(now, peer, false)
			b.openAt = 0
			b.failures = s.cfg.BreakerFailures - 1
		}
	}
}

// Stats returns the core's counters and the exchanges sent and failed.
func (s *Shell) Stats() (Stats, uint64, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.coord.Stats(), s.sent.Load(), s.failed.Load()
}

// Close stops the shell's goroutines and waits for exchanges in flight
// (each bounded by CallTimeout). It does not close the Transport.
func (s *Shell) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.stop)
	s.wg.Wait()
	return nil
}

// String names the shell for logs.
func (s *Shell) String() string { return fmt.Sprintf("shell(%s)", s.cfg.Coordinator.Self) }
