package bucket

import (
	"fmt"
	"time"
)

// PenaltyConfig configures a Penalty box. Zero fields take the documented
// defaults.
type PenaltyConfig struct {
	// Threshold is the number of rejections within Window that locks an
	// identity out. Must be >= 1.
	Threshold int64
	// Window is the span in which Threshold rejections count; it starts at
	// the first rejection recorded. 0 means one minute.
	Window time.Duration
	// Base is the first lockout. Must be > 0.
	Base time.Duration
	// Max caps the lockout, which doubles on each further lockout. It is
	// also the quiet time after a lockout ends after which the level decays
	// back to 0. 0 means 32 × Base.
	Max time.Duration
}

// PenaltyState is the state of one penalty box. The zero value (and any
// state at now >= Expire) equals no entry: no recent rejections, not locked,
// level 0.
type PenaltyState struct {
	WinStart int64 // start of the current rejection window, ns
	Count    int64 // rejections recorded since WinStart
	Level    int64 // lockouts so far; the next lasts Base·2^Level, capped at Max
	Until    int64 // end of the current lockout, ns (locked iff now < Until)
	Expire   int64 // from then on the state equals no entry
}

// Idle reports whether the state equals no entry at now.
func (s *PenaltyState) Idle(now int64) bool { return now >= s.Expire }

// Penalty is a penalty box for identities that keep getting rejected (the
// HTTP layer's penalty option): after Threshold rejections within Window the
// identity is locked out for Base, doubling on each further lockout, capped
// at Max; once it has been quiet (not locked) for Max the level decays to 0.
//
// Two steppers: *Penalty checks (Step rejects with RetryAfter while locked
// and changes nothing), and the Recorder records rejections (cost is the
// number of rejections; 0 records none). Decision.Limit is Threshold and
// Remaining the rejections still tolerated before a lockout. A clock going
// backwards leaves a lockout in force (now < Until holds longer).
// Immutable, safe for concurrent use; use NewPenalty.
type Penalty struct {
	threshold int64
	window    int64
	base      int64
	max       int64
}

// NewPenalty returns a Penalty box. It returns an error naming the bad field
// if Threshold < 1, Base <= 0, Window < 0, or Max < 0 or below Base.
func NewPenalty(cfg PenaltyConfig) (Penalty, error) {
	if cfg.Window == 0 {
		cfg.Window = time.Minute
	}
	if cfg.Max == 0 {
		cfg.Max = 32 * cfg.Base
	}
	switch {
	case cfg.Threshold < 1:
		return Penalty{}, fmt.Errorf("bucket: PenaltyConfig.Threshold %d: must be >= 1", cfg.Threshold)
	case cfg.Base <= 0:
		return Penalty{}, fmt.Errorf("bucket: PenaltyConfig.Base %v: must be > 0", cfg.Base)
	case cfg.Window < 0:
		return Penalty{}, fmt.Errorf("bucket: PenaltyConfig.Window %v: must be >= 0", cfg.Window)
	case cfg.Max < cfg.Base:
		return Penalty{}, fmt.Errorf("bucket: PenaltyConfig.Max %v: must be >= Base %v", cfg.Max, cfg.Base)
	}
	return Penalty{threshold: cfg.Threshold, window: int64(cfg.Window), base: int64(cfg.Base), max: int64(cfg.Max)}, nil
}

// Step checks: rejected with RetryAfter = the rest of the lockout while
// locked, allowed otherwise. It never changes the state; cost is ignored.
func (p *Penalty) Step(s *PenaltyState, now, cost int64) Decision {
	return p.Check(*s, now)
}

// Check reports whether the identity is locked out at now.
func (p *Penalty) Check(s PenaltyState, now int64) Decision {
	d := Decision{Limit: p.threshold, Remaining: p.threshold - p.count(s, now)}
	if now < s.Expire {
		d.Reset = time.Duration(s.Expire - now)
	}
	if now < s.Until {
		d.RetryAfter = time.Duration(s.Until - now)
		return d
	}
	d.Allowed = true
	return d
}

// count is the rejections in the current window at now.
func (p *Penalty) count(s PenaltyState, now int64) int64 {
	if s.Count == 0 || now >= s.WinStart+p.window {
		return 0
	}
	return s.Count
}

// Record records n rejections at now, locking the identity out when the
// count reaches Threshold, and returns the resulting Check. Rejections while
// locked are not counted.
func (p *Penalty) Record(s *PenaltyState, now, n int64) Decision {
	if n <= 0 || now < s.Until {
		return p.Check(*s, now)
	}
	if s.Level > 0 && now >= s.Until+p.max {
		s.Level = 0
	}
	if p.count(*s, now) == 0 {
		s.WinStart, s.Count = now, 0
	}
	s.Count += n
	if s.Count >= p.threshold {
		lock := p.max
		if s.Level < 62 && p.base <= p.max>>s.Level {
			lock = min(p.base<<s.Level, p.max)
		}
		s.Until = now + lock
		s.Level++
		s.Count = 0
	}
	s.Expire = 0
	if s.Count > 0 {
		s.Expire = s.WinStart + p.window
	}
	if s.Level > 0 {
		s.Expire = max(s.Expire, s.Until+p.max)
	}
	return p.Check(*s, now)
}

// Recorder returns the stepper that records rejections (cost = count).
func (p Penalty) Recorder() PenaltyRecorder { return PenaltyRecorder{p: p} }

// PenaltyRecorder is the stepper form of Penalty.Record, for Store.Apply.
// Immutable, safe for concurrent use.
type PenaltyRecorder struct {
	p Penalty
}

// Step records cost rejections at now.
func (r *PenaltyRecorder) Step(s *PenaltyState, now, cost int64) Decision {
	return r.p.Record(s, now, cost)
}
