package weir

import "time"

// Clock returns the current time. weir reads it once per decision and passes
// the value down to the pure algorithms in bucket/; nothing below node.go reads
// a clock of its own. Tests and the simulator inject a fake one.
type Clock func() time.Time

// monotonicNanos is the default clock: wall time in unix nanoseconds anchored
// once at start, then advanced by the monotonic clock, so that a wall-clock
// step (NTP, an operator) never moves a bucket backwards or forwards.
func monotonicNanos() func() int64 {
	base := time.Now()
	wall := base.UnixNano()
	return func() int64 { return wall + int64(time.Since(base)) }
}

// clockNanos adapts a Clock to the int64 nanoseconds bucket/ works in.
func clockNanos(c Clock) func() int64 {
	if c == nil {
		return monotonicNanos()
	}
	return func() int64 { return c().UnixNano() }
}
