package weir

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir/quota"
)

// EventsKept is how many recent events ops.Events keeps: a bounded ring,
// the oldest overwritten first.
const EventsKept = 128

// eventCoalesce is how close in time two events of the same kind, rule and
// reason must be to be counted as one (Event.Count).
const eventCoalesce = int64(time.Second)

// Event kinds.
const (
	// EventFailOpen is a decision made by a rule's on_failure policy
	// because the identity's owner, or the lease group for a durable rule,
	// could not answer in time (weir_fail_open_total counts every one).
	EventFailOpen = "fail_open"
	// EventFallback is a region enforcing a global rule's fallback share
	// because its lease could not be renewed (reported by the lease
	// enforcement work, counted by weir_global_fallback).
	EventFallback = "fallback"
)

// Event is one fail-open or fallback event, or a run of them on one rule
// for one reason less than a second apart (Count of them, the last one at
// At). Events are a sample meant for people: the counters
// (weir_fail_open_total) are exact; events are dropped when many cores
// record them at the same instant (ops.EventsDropped).
type Event struct {
	At     time.Time `json:"at"`
	Kind   string    `json:"kind"`
	Rule   string    `json:"rule"`
	Reason string    `json:"reason"`
	// Identity is the last identity of the run ("" for a global rule).
	Identity string `json:"identity"`
	Count    uint64 `json:"count"`
}

// eventRec is an Event as the ring keeps it (unix ns, no allocation).
type eventRec struct {
	at, first          int64
	kind, rule, reason string
	identity           string
	count              uint64
}

// eventLog is the bounded ring of recent events. add never blocks: when
// another goroutine holds the ring, the event is counted as dropped.
type eventLog struct {
	mu      sync.Mutex
	buf     [EventsKept]eventRec
	n       uint64 // events stored so far (the next slot is n % EventsKept)
	dropped atomic.Uint64
}

// add records one event at now, coalescing it with the newest one when it
// has the same kind, rule and reason and is less than eventCoalesce later.
// The strings are kept as given (no copy, no allocation).
func (l *eventLog) add(now int64, kind, rule, reason, identity string) {
	if !l.mu.TryLock() {
		l.dropped.Add(1)
		return
	}
	defer l.mu.Unlock()
	if l.n > 0 {
		last := &l.buf[(l.n-1)%EventsKept]
		if last.kind == kind && last.rule == rule && last.reason == reason && now-last.at < eventCoalesce && now >= last.at {
			last.at, last.identity = now, identity
			last.count++
			return
		}
	}
	l.buf[l.n%EventsKept] = eventRec{at: now, first: now, kind: kind, rule: rule, reason: reason, identity: identity, count: 1}
	l.n++
}

// recent returns the events kept, newest first.
func (l *eventLog) recent() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := min(l.n, EventsKept)
	out := make([]Event, 0, k)
	for i := range k {
		e := &l.buf[(l.n-1-i)%EventsKept]
		out = append(out, Event{At: time.Unix(0, e.at).UTC(), Kind: e.kind, Rule: e.rule, Reason: e.reason, Identity: e.identity, Count: e.count})
	}
	return out
}

// events returns the node's recent fail-open and fallback events, newest
// first (at most EventsKept; see Event).
func (n *Node) events() []Event { return n.ops.events.recent() }

// eventsDropped counts events not kept because the ring was busy (the
// decisions themselves are counted all the same).
func (n *Node) eventsDropped() uint64 { return n.ops.events.dropped.Load() }

// failOpenReason names why on_failure decided, without allocating.
func failOpenReason(durable bool, of quota.OnFailure) string {
	if durable {
		switch of {
		case quota.OnFailureOpen:
			return "lease group did not answer: on_failure open admitted"
		case quota.OnFailureClosed:
			return "lease group did not answer: on_failure closed rejected"
		}
		return "lease group did not answer: rejected (a durable rule's local fallback rejects)"
	}
	switch of {
	case quota.OnFailureOpen:
		return "owner unreachable: on_failure open admitted"
	case quota.OnFailureClosed:
		return "owner unreachable: on_failure closed rejected"
	}
	return "owner unreachable: on_failure local decided on this node's share"
}
