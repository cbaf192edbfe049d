package shell

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/weir-dev/weir/cluster"
)

// nudge carries out what Links.Decided makes of a decision that left its
// shard with pending (the decision waits for a peer), ready
// (Coordinator.HasReady) and queued (Coordinator.Queued): a flush now, the
// backstop flush after the linger, or nothing. A decision that left
// nothing to send (a local admission or rejection) takes no lock:
// Decided answers NudgeNone to it.
func (s *Node) nudge(pending, ready bool, queued int) {
	if (!pending && !ready) || s.closed.Load() {
		return // nothing is sent once Close has begun
	}
	s.lkMu.Lock()
	n := s.lk.Decided(pending, ready, queued)
	s.lkMu.Unlock()
	switch n {
	case cluster.NudgeFlush:
		s.flush()
	case cluster.NudgeLinger:
		s.signalFlusher()
	}
}

// collect flushes when a decision left work pending for a returning
// exchange (Links.Collect).
func (s *Node) collect() {
	if s.closed.Load() {
		return
	}
	s.lkMu.Lock()
	p := s.lk.Collect()
	s.lkMu.Unlock()
	if p {
		s.flush()
	}
}

// kick asks for the backstop flush after the linger, unless one is due
// already.
func (s *Node) kick() {
	s.lkMu.Lock()
	k := s.lk.Kick()
	s.lkMu.Unlock()
	if k {
		s.signalFlusher()
	}
}

// signalFlusher wakes the flusher, which flushes after the linger. Links
// asks for one backstop flush at a time, so the channel has room.
func (s *Node) signalFlusher() {
	select {
	case s.flushC <- struct{}{}:
	default:
	}
}

// Handle is the Transport Handler: it steps an incoming batch through the
// core and returns what the core has for the sender as the reply.
func (s *Node) Handle(ctx context.Context, from string, m *cluster.Message) (*cluster.Message, error) {
	if s.closed.Load() {
		return nil, errors.New("cluster: node closed")
	}
	reply := &cluster.Message{}
	var others []cluster.Envelope
	for _, env := range s.step(from, m) {
		if env.To != from {
			others = append(others, env)
			continue
		}
		// The reply carries one batch, in arrays of its own (the
		// transport drops it once encoded, so the pool's would not come
		// back); anything beyond it follows as exchanges of its own.
		var rest cluster.Message
		first := true
		eachPart(&env.Msg, s.cfg.MaxBatch, func(part *cluster.Message) bool {
			if first {
				*reply, first = cloneMessage(part), false
			} else {
				if rest.Items() == 0 {
					rest = s.pool.get()
				}
				rest.Merge(part)
			}
			return true
		})
		if rest.Items() > 0 {
			others = append(others, cluster.Envelope{To: from, Msg: rest})
		}
		s.pool.put(&env.Msg)
	}
	for _, env := range others {
		s.send(env)
	}
	return reply, nil
}

// complete hands completions to their waiters (under sh.mu).
func (sh *shard) complete(cs []cluster.Completion) {
	for _, c := range cs {
		if ch, ok := sh.waits[c.Ticket]; ok {
			o := c.Outcome
			o.Ticket = c.Ticket // a concurrency slot is released by it
			ch <- o
			delete(sh.waits, c.Ticket)
		}
	}
}

func (s *Node) ticker() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			for i := range s.shards {
				sh := &s.shards[i]
				sh.lock()
				sh.coord.Tick(s.now())
				sh.mu.Unlock()
			}
			s.mu.Lock()
			// Cooled-down breakers are half-open: decisions go to the
			// peer again, and the next batch to it is the trial.
			s.lkMu.Lock()
			up := s.lk.Tick(s.now(), nil)
			s.lkMu.Unlock()
			for _, peer := range up {
				s.setPeerDown(s.now(), peer, false)
			}
			s.mu.Unlock()
			s.flush()
		}
	}
}

func (s *Node) flusher() {
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
			s.lkMu.Lock()
			s.lk.Lingered()
			s.lkMu.Unlock()
			s.flush()
		}
	}
}

// Flush reports every identity's unsent spend to its owner and waits for
// the exchanges (each bounded by CallTimeout): a node does it before it
// leaves, so that what it admitted is charged.
func (s *Node) Flush() { s.flushWith(func(now int64, c *cluster.Coordinator) { c.FlushAll(now) }) }

// Leave hands every bucket this node owns to its owner in the ring without
// this node, reports all unsent spend, and waits for the exchanges: the
// graceful half of leaving (the caller then leaves the membership).
func (s *Node) Leave() {
	r := s.ring.Load()
	var rest []cluster.Member
	for _, m := range r.Members() {
		if m.Name != s.cfg.Coordinator.Self {
			rest = append(rest, m)
		}
	}
	next, err := cluster.NewRing(r.Epoch()+1, rest)
	if err != nil || next.Len() == 0 {
		s.Flush()
		return
	}
	s.flushWith(func(now int64, c *cluster.Coordinator) { c.HandoffAll(now, next) })
}

func (s *Node) flushWith(queue func(now int64, c *cluster.Coordinator)) {
	var wg sync.WaitGroup
	for _, env := range s.withAll(queue) {
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
					// What stepping the reply readied (acknowledgements,
					// results of decides forwarded here, other
					// requests' work taken with it) goes as any send.
					for _, e := range s.step(env.To, reply) {
						s.send(e)
					}
				}
			}
		}()
	}
	wg.Wait()
}

// addrOf returns a member's peer address from the ring (its name if absent).
func (s *Node) addrOf(name string) string {
	if r := s.ring.Load(); r != nil {
		if i := r.IndexOf(name); i >= 0 {
			return r.Member(i).Addr
		}
	}
	return name
}

// flush sends everything the core has queued, one exchange per peer.
//
// What is due to a peer with an exchange in flight joins its Backlog
// straight from the shards' outboxes: under load, when every peer is busy,
// the items are copied once on their way, not merged first. (An exchange
// may start or end meanwhile: each shard's items for a peer go, whole, to
// its Backlog if it is busy then, else into the batch sent at the end.
// s.mu serialises flushes; lkMu is held only for each Links call, so that
// a decision's nudge never waits for a flush.)
func (s *Node) flush() {
	out := outboxes{pool: &s.pool}
	s.mu.Lock()
	out.lk, out.lkMu = s.lk, &s.lkMu
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		s.take(i, &out, len(s.shards)-i)
		sh.mu.Unlock()
	}
	s.mu.Unlock()
	for _, env := range out.envs {
		s.send(env)
	}
}

// send exchanges one batch with a peer in its own goroutine and steps the
// reply back in. Failures feed the peer's breaker.
func (s *Node) send(env cluster.Envelope) {
	// One exchange in flight per peer (Links.Send): what is due to a busy
	// peer joins its Backlog for the next exchange.
	s.lkMu.Lock()
	p := s.lk.Peer(env.To)
	start := s.lk.Send(p, &env.Msg)
	s.lkMu.Unlock()
	if !start {
		s.pool.put(&env.Msg) // the Backlog copied the items
		return
	}
	addr := s.addrOf(env.To)
	s.wg.Add(1)
	go s.run(env.To, p, addr, env.Msg)
}

// run exchanges msg with the peer to (p in the Links), then whatever
// queued for it meanwhile, until nothing does; the peer is marked busy
// throughout. The
// arrays of each message sent go back to the peer's Backlog, for it to
// fill while the next exchange is in flight (and to the pool at the end).
// It calls s.wg.Done when it returns.
func (s *Node) run(to string, p int, addr string, msg cluster.Message) {
	defer s.wg.Done()
	for {
		// Most batches fit in one exchange; a larger one goes as parts
		// that are windows on its arrays (the transport copies nothing
		// back into them), in Split's order.
		eachPart(&msg, s.cfg.MaxBatch, func(part *cluster.Message) bool {
			// A failed part ends the batch: the rest is dropped, as a
			// lost message.
			return s.exchange(to, p, addr, part)
		})
		// What the shards queued while this exchange was in flight goes
		// now: this peer's part joins the queue below.
		s.collect()
		s.lkMu.Lock()
		if s.closed.Load() {
			s.lk.Drop(p)
			s.lkMu.Unlock()
			s.pool.put(&msg)
			return
		}
		// The exchange is over: the transport kept nothing of msg, whose
		// arrays the next exchange reuses.
		next, more := s.lk.Next(p, &msg)
		if !more {
			s.lkMu.Unlock()
			s.pool.put(&msg)
			s.collect()
			return
		}
		msg = next
		s.lkMu.Unlock()
	}
}

// exchange sends one batch, steps the reply in and sends what follows from
// it; it reports whether the exchange succeeded.
func (s *Node) exchange(to string, p int, addr string, msg *cluster.Message) bool {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CallTimeout)
	defer cancel()
	reply, err := s.cfg.Transport.Exchange(ctx, addr, msg)
	s.sent.Add(1)
	if err != nil {
		s.failed.Add(1)
	}
	s.lkMu.Lock()
	b := s.lk.Outcome(s.now(), p, err == nil)
	s.lkMu.Unlock()
	s.mu.Lock()
	switch b {
	case cluster.BreakerOpened:
		s.setPeerDown(s.now(), to, true)
		s.log.Warn("peer unreachable: its identities fall back to on_failure", "peer", to, "err", err)
	case cluster.BreakerClosed:
		s.peerUp(to)
	}
	s.mu.Unlock()
	var envs []cluster.Envelope
	if err == nil && reply != nil && !reply.Empty() {
		envs = s.step(to, reply)
	}
	if s.closed.Load() {
		return false
	}
	for _, e := range envs {
		s.send(e)
	}
	return err == nil
}

// peerUp marks a peer whose breaker closed up again in every shard (under
// s.mu).
func (s *Node) peerUp(peer string) {
	s.setPeerDown(0, peer, false)
	s.log.Info("peer reachable again", "peer", peer)
}

// setPeerDown marks peer down or back in every shard (under s.mu). The
// requests a shard then decides by on_failure complete at the next flush.
func (s *Node) setPeerDown(now int64, peer string, down bool) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.lock()
		sh.coord.SetPeerDown(now, peer, down)
		sh.mu.Unlock()
	}
	if down {
		s.kick() // the on_failure completions go at the backstop flush
	}
}
