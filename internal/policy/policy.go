// Package policy is the multi-rule policy of one request, as a pure step
// machine: in which order a request's rules are looked at, charged, given
// back and reported when several rules apply to it. A node runs it for
// every request (weir.Node's Allow), and so can the simulator: the machine
// holds no clock, store or lock; the caller carries out each step on its
// rules' stores and feeds back what a look or a charge answered.
//
// The policy:
//
//   - With more than one enforced rule, look before charging: every
//     enforced local rule is looked at (no charge) first, and a request one
//     of them rejects charges nothing. (Between the look and the charge
//     another request may spend a bucket; then the charge rejects and the
//     rules charged before it keep the charge. That race costs tokens,
//     never admits too many.)
//   - Cluster rules cannot be looked at without a charge: they are charged
//     one by one, before the local rules, stopping at the first rejection;
//     the cluster rules that admitted before it are given their tokens
//     back, so that two rules on one request do not starve each other.
//   - Durable rules are charged last among the remote ones, once every
//     cluster rule has passed and every local one passed its look, and are
//     never given back (a refund would be a second Raft commit, lost if the
//     node crashed between the two). A durable rule is charged for a request
//     that is then rejected only when a local bucket is spent between its
//     look and its charge, or when a request carries two durable rules.
//   - The local rules are charged once the remote ones admitted (each of
//     them, even after one rejects: their looks passed).
//   - Shadow rules are decided after the enforced ones: charged as if
//     enforced when the request is admitted, reported as they stand when
//     it is not. They never change the request's outcome.
//   - A rule not charged because the request is rejected is reported as it
//     stands (whether it would have rejected too).
package policy

// Kind is how a rule of a request is decided.
type Kind uint8

const (
	// Local: by this node's own store; it can be looked at without a
	// charge.
	Local Kind = iota
	// Cluster: by the identity's owner in the region; a charge can be
	// given back.
	Cluster
	// Durable: by the lease group; a charge is final.
	Durable
)

// Rule is one rule of a request as the policy sees it.
type Rule struct {
	Kind   Kind
	Shadow bool // decided and reported, but never deciding the request
}

// Action is a step the caller carries out on rule Step.I.
type Action uint8

const (
	// Done: the request is decided; Allowed says how.
	Done Action = iota
	// Look at the rule without charging it, and feed back with Result
	// whether it would admit.
	Look
	// Take: charge the rule, and feed back with Result whether it
	// admitted.
	Take
	// Refund the tokens the rule (a cluster rule) admitted.
	Refund
	// Report the rule as it stands, not charged: the request is rejected
	// by another rule.
	Report
	// ReportLook: report the rule's rejecting look (nothing was charged):
	// it is why the request is rejected.
	ReportLook
)

// String names the action.
func (a Action) String() string {
	switch a {
	case Done:
		return "Done"
	case Look:
		return "Look"
	case Take:
		return "Take"
	case Refund:
		return "Refund"
	case Report:
		return "Report"
	case ReportLook:
		return "ReportLook"
	}
	return "Action(?)"
}

// Step is one action on rule I of the request.
type Step struct {
	Action Action
	I      int
}

type phase uint8

const (
	phLook      phase = iota // looks at the enforced local rules
	phRejectAll              // a look rejected: report every enforced rule
	phCluster                // charge the cluster rules
	phDurable                // charge the durable rules
	phRefund                 // give back the cluster rules charged before a rejection
	phLocal                  // charge the local rules (or report them, rejected)
	phShadow                 // the shadow rules
	phDone
)

// Request is the policy of one request in progress. The zero Request is
// not usable; Start one. The request's rules are passed to every Next (the
// Request keeps no reference to them, so that a caller's array of them
// stays on its stack).
type Request struct {
	n     int // the number of rules
	ph    phase
	i     int // the next rule the phase considers
	first int // the rule whose look rejected (phRejectAll)
	// phRefund gives back the cluster rules before refundTo, then the
	// request goes on in phase back at index backAt.
	refundTo, backAt int
	back             phase
	allowed          bool
	await            Action // Look or Take: Result comes next
	// has[ph] says whether the request has a rule phase ph acts on
	// (phCluster, phDurable, phLocal, phShadow): the others are skipped.
	has [phDone]bool
}

// Single reports whether the policy of a request with rules is one step,
// Take of its only rule, an enforced one: the common request, which a
// caller may then charge without running a Request (whose steps would be
// that Take and Done).
func Single(rules []Rule) bool { return len(rules) == 1 && !rules[0].Shadow }

// Start begins the policy of a request with rules.
func (r *Request) Start(rules []Rule) {
	*r = Request{n: len(rules), allowed: true}
	enforced := 0
	for _, ru := range rules {
		switch {
		case ru.Shadow:
			r.has[phShadow] = true
		case ru.Kind == Cluster:
			r.has[phCluster] = true
		case ru.Kind == Durable:
			r.has[phDurable] = true
		default:
			r.has[phLocal] = true
		}
		if !ru.Shadow {
			enforced++
		}
	}
	if enforced > 1 {
		r.ph = phLook
		return
	}
	r.ph = r.after(phLook)
}

// after returns the first phase after ph, in the policy's order, that the
// request has rules for.
func (r *Request) after(ph phase) phase {
	for _, next := range [...]phase{phCluster, phDurable, phLocal, phShadow} {
		if next > ph && r.has[next] {
			return next
		}
	}
	return phDone
}

// Allowed reports whether the request is admitted (so far, and finally once
// Next returned Done).
func (r *Request) Allowed() bool { return r.allowed }

// Result feeds back what the Look or Take that Next just returned answered.
func (r *Request) Result(admitted bool) {
	switch r.await {
	case Look:
		if !admitted {
			r.first = r.i - 1
			r.ph, r.i, r.allowed = phRejectAll, 0, false
		}
	case Take:
		switch r.ph {
		case phCluster, phDurable:
			if !admitted {
				r.allowed = false
				r.refundTo = r.i - 1
				if r.ph == phDurable {
					r.refundTo = r.n // every cluster rule admitted
				}
				r.back, r.backAt = r.ph, r.i
				r.ph, r.i = phRefund, 0
			}
		case phLocal:
			if !admitted {
				r.allowed = false
			}
		}
	}
	r.await = Done
}

// Next returns the next step on rules (those given to Start), and Done
// (with I 0) once the request is decided. After a Look or a Take the caller
// calls Result before Next.
func (r *Request) Next(rules []Rule) Step {
	for {
		if s, ok := r.step(rules); ok {
			if s.Action == Look || s.Action == Take {
				r.await = s.Action
			}
			return s
		}
		if r.ph == phDone {
			return Step{}
		}
	}
}

// step returns the phase's next step, or false when the phase moved on.
func (r *Request) step(rules []Rule) (Step, bool) {
	for r.i < r.n && r.ph != phDone {
		i := r.i
		ru := rules[i]
		r.i++
		switch r.ph {
		case phLook:
			if !ru.Shadow && ru.Kind == Local {
				return Step{Look, i}, true
			}
		case phRejectAll:
			switch {
			case ru.Shadow:
			case i == r.first:
				return Step{ReportLook, i}, true
			default:
				return Step{Report, i}, true
			}
		case phCluster, phDurable:
			want := Cluster
			if r.ph == phDurable {
				want = Durable
			}
			if ru.Shadow || ru.Kind != want {
				continue
			}
			if !r.allowed {
				return Step{Report, i}, true
			}
			return Step{Take, i}, true
		case phRefund:
			if i >= r.refundTo {
				r.ph, r.i = r.back, r.backAt
				continue
			}
			if !ru.Shadow && ru.Kind == Cluster {
				return Step{Refund, i}, true
			}
		case phLocal:
			if ru.Shadow || ru.Kind != Local {
				continue
			}
			if !r.allowed {
				return Step{Report, i}, true
			}
			return Step{Take, i}, true
		case phShadow:
			if !ru.Shadow {
				continue
			}
			if r.allowed {
				return Step{Take, i}, true
			}
			return Step{Report, i}, true
		}
	}
	r.endPhase()
	return Step{}, false
}

// endPhase moves on from a phase whose rules are all seen.
func (r *Request) endPhase() {
	r.i = 0
	switch r.ph {
	case phRejectAll:
		r.ph = r.after(phLocal)
	case phRefund:
		r.ph, r.i = r.back, r.backAt
	default:
		r.ph = r.after(r.ph)
	}
}
