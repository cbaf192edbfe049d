package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The checks the process fault harness (faults_test.go) runs at the end, on
// the records of the load and on the processes.

// excused reports whether a call over [call, ret] overlaps one of ws
// stretched by grace at their end (a call sent to a stopped process waits
// for its timeout; a client reconnects to a restarted one).
func excused(ws []window, call, ret int64, grace time.Duration) bool {
	for _, w := range ws {
		if call <= w.to+int64(grace) && ret >= w.from {
			return true
		}
	}
	return false
}

// check runs the checks on the records and the processes at the end.
func (h *harness) check(l *load) {
	t := h.t
	// 1. Every process runs and has rejoined.
	if !h.recovered(60 * time.Second) {
		h.violation("at the end the fleet has not recovered within 60s")
	}
	for _, p := range h.all() {
		select {
		case <-p.current().done:
			h.violation("%s is not running at the end", p.name)
		default:
		}
	}

	// 2. Caller errors only from a process that was down.
	var rlsN, rlsErr, rlsExcused, rlsOver int
	for _, r := range l.rls {
		rlsN++
		switch r.Out {
		case 1:
			rlsOver++
		case 2:
			rlsErr++
			g := h.gws[r.GW]
			if excused(g.windows, r.Call, r.Return, 5*time.Second) {
				rlsExcused++
			} else {
				h.violation("an RLS error from %s at t=%v..%v, outside its fault windows %v (first error: %s)", g.name,
					time.Duration(r.Call), time.Duration(r.Return), g.windows, l.firstRLSErr[g.name])
			}
		}
	}
	var voterWindows []window
	for _, v := range h.voters {
		voterWindows = append(voterWindows, v.windows...)
	}
	var durN, durAdm, durRej, durUnk, durExcused int
	for _, r := range l.durable {
		durN++
		switch r.Out {
		case outAdmitted:
			durAdm++
		case outRejected:
			durRej++
		default:
			durUnk++
			if r.Return >= h.loadEnd || excused(voterWindows, r.Call, r.Return, 10*time.Second) {
				durExcused++
			} else {
				h.violation("a durable decision failed at t=%v..%v, outside every voter's fault window (first error: %s)",
					time.Duration(r.Call), time.Duration(r.Return), l.firstDurErr["durable"])
			}
		}
	}
	// The longest durable answer (or failure) as the caller saw it, inside
	// a voter's fault window (two voters killed: no quorum) and outside.
	var durSlowIn, durSlowOut time.Duration
	for _, r := range l.durable {
		if r.Return >= h.loadEnd {
			continue
		}
		d := time.Duration(r.Return - r.Call)
		if excused(voterWindows, r.Call, r.Return, 0) {
			durSlowIn = max(durSlowIn, d)
		} else {
			durSlowOut = max(durSlowOut, d)
		}
	}
	t.Logf("durable: longest answer %v inside a voter's fault window, %v outside (the caller's deadline is 3s)", durSlowIn.Round(time.Millisecond), durSlowOut.Round(time.Millisecond))
	t.Logf("RLS: %d decisions, %d over limit, %d errors (%d from a process down or just back); first errors %v", rlsN, rlsOver, rlsErr, rlsExcused, l.firstRLSErr)
	t.Logf("durable: %d decisions (%d admitted, %d rejected, %d failed, %d of them in a voter's fault window or cut off by the end of the run) on %d identities; first error %v",
		durN, durAdm, durRej, durUnk, durExcused, len(distinctIDs(l.durable)), l.firstDurErr)

	// 3. Shared and exact rules: the hot admissions within the envelope.
	h.checkEnvelope(l)

	// 4. Durable decisions: no identity past its limit, and the history is
	// linearizable against the bucket model.
	if over := overAdmitted(l.durable, durableBurst); len(over) > 0 {
		h.violation("durable: %d identities admitted past the burst of %d: %v", len(over), durableBurst, over)
	}
	checked := time.Now()
	res, _ := porcupine.CheckOperationsVerbose(durableModel(durableBurst), durableHistory(l.durable), 5*time.Minute)
	t.Logf("durable: porcupine says %s on %d operations in %v", res, durN, time.Since(checked).Round(time.Millisecond))
	if res != porcupine.Ok {
		h.violation("durable: the history of durable decisions is %s against the bucket model", res)
	}

	// 5. Rules: every acknowledged PUT is on every voter and gateway, and
	// the history has no gap.
	h.putMu.Lock()
	puts := slices.Clone(h.puts)
	h.putMu.Unlock()
	var acked, failed int
	maxAcked := map[string]int{}        // rule id -> newest acknowledged seq
	issued := map[string]map[int]bool{} // rule id -> every seq sent
	var top uint64
	for _, p := range puts {
		if issued[p.id] == nil {
			issued[p.id] = map[int]bool{}
		}
		issued[p.id][p.seq] = true
		if p.version == 0 {
			failed++
			continue
		}
		acked++
		maxAcked[p.id] = max(maxAcked[p.id], p.seq)
		top = max(top, p.version)
	}
	var final rulesDoc
	converged := false
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !converged; time.Sleep(200 * time.Millisecond) {
		lead, err := h.rules(h.voters[0], true)
		if err != nil {
			continue
		}
		converged = true
		for _, p := range h.all() {
			doc, err := h.rules(p, false)
			if err != nil || doc.Version != lead.Version {
				converged = false
				break
			}
		}
		final = lead
	}
	if !converged {
		h.violation("rules: the voters and gateways do not agree on the rule set version within 30s")
	}
	if final.Version < top {
		h.violation("rules: the group is at version %d, below the acknowledged version %d", final.Version, top)
	}
	for _, p := range h.all() {
		doc, err := h.rules(p, false)
		if err != nil {
			h.violation("rules on %s: %v", p.name, err)
			continue
		}
		have := map[string]int64{}
		for _, r := range doc.Rules {
			have[r.ID] = r.Limit
		}
		for id, seq := range maxAcked {
			got, ok := have[id]
			gotSeq := int(got - 1000)
			if !ok || gotSeq < seq || !issued[id][gotSeq] {
				h.violation("rules on %s: %s has limit %d (present %v), want the acknowledged PUT %d (limit %d) or a later one", p.name, id, got, ok, seq, 1000+seq)
			}
		}
	}
	// The voters apply the rules they store (rules.lease): their rule set
	// version is the group's.
	for _, v := range h.voters {
		ov, err := overview(v.current().addrs.HTTP)
		if err != nil || ov.Status.RulesVersion != final.Version {
			h.violation("%s enforces rule set version %d (%v), the group is at %d", v.name, ov.Status.RulesVersion, err, final.Version)
		}
	}
	hist := h.history()
	for i := 1; i < len(hist); i++ {
		if hist[i].Version != hist[i-1].Version+1 {
			h.violation("rules history: version %d follows %d", hist[i].Version, hist[i-1].Version)
		}
	}
	if n := len(hist); n == 0 || hist[n-1].Version != final.Version {
		h.violation("rules history of %d entries does not end at the version %d", n, final.Version)
	}
	byVersion := map[uint64]histEntry{}
	for _, e := range hist {
		byVersion[e.Version] = e
	}
	for _, p := range puts {
		if p.version == 0 {
			continue
		}
		e, ok := byVersion[p.version]
		if !ok || e.RuleID != p.id || e.After.Limit != int64(1000+p.seq) {
			h.violation("rules history: the acknowledged PUT %d of %s (v%d) is not there: %+v", p.seq, p.id, p.version, e)
		}
	}
	t.Logf("rules: %d PUTs, %d acknowledged, %d failed; version %d, history %d entries without a gap", len(puts), acked, failed, final.Version, len(hist))

	// 6. File descriptors, loosely against the baseline after warm-up.
	var fds []string
	for _, p := range h.all() {
		n, err := fdCount(p.current().cmd.Process.Pid)
		if err != nil {
			h.violation("fds of %s: %v", p.name, err)
			continue
		}
		fds = append(fds, fmt.Sprintf("%s %d→%d (%d starts)", p.name, p.baseFDs, n, p.starts))
		if n > 2*p.baseFDs+20 {
			h.violation("%s holds %d file descriptors, baseline %d", p.name, n, p.baseFDs)
		}
	}
	t.Logf("file descriptors, baseline→end: %s", strings.Join(fds, ", "))
}

func distinctIDs(recs []durableRec) map[uint32]bool {
	m := map[uint32]bool{}
	for _, r := range recs {
		m[r.ID] = true
	}
	return m
}

// histEntry is an entry of GET /v1/rules/history.
type histEntry struct {
	Version uint64 `json:"version"`
	Op      string `json:"op"`
	RuleID  string `json:"rule_id"`
	After   struct {
		Limit int64 `json:"limit"`
	} `json:"after"`
}

// history reads the whole rules history from the first voter, page by
// page.
func (h *harness) history() []histEntry { return h.historyFrom(h.voters[0]) }

// historyFrom reads the whole rules history from voter v, page by page.
func (h *harness) historyFrom(v *fproc) []histEntry {
	var all []histEntry
	var since uint64
	for {
		code, b, err := h.admin(http.MethodGet, fmt.Sprintf("http://%s/v1/rules/history?since=%d&limit=1000", v.current().addrs.HTTP, since), nil)
		if err != nil || code != http.StatusOK {
			h.violation("rules history: %d %v %.200s", code, err, b)
			return all
		}
		var doc struct {
			Version uint64      `json:"version"`
			Entries []histEntry `json:"entries"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			h.violation("rules history: %v", err)
			return all
		}
		all = append(all, doc.Entries...)
		if len(doc.Entries) == 0 || doc.Entries[len(doc.Entries)-1].Version >= doc.Version {
			return all
		}
		since = doc.Entries[len(doc.Entries)-1].Version
	}
}
