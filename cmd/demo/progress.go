package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/weir-dev/weir/ops"
)

// printer writes the demo's output. On a terminal it keeps a compact table
// at the bottom, redrawn in place (ANSI: cursor up, clear to the end of the
// screen), and prints events above it; elsewhere (CI, a pipe) it prints
// plain lines.
type printer struct {
	mu    sync.Mutex
	w     io.Writer
	tty   bool
	start time.Time
	drawn int // lines of the table on screen
	table []string
}

// event prints one timestamped line (above the table on a terminal).
func (p *printer) event(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.erase()
	fmt.Fprintf(p.w, "t=%5.1fs  %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
	p.draw()
}

// printf prints text as it is (above the table on a terminal).
func (p *printer) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.erase()
	fmt.Fprintf(p.w, format, args...)
	p.draw()
}

// Write prints p's bytes as they are (above the table on a terminal): the
// nodes' log lines.
func (p *printer) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.erase()
	n, err := p.w.Write(b)
	p.draw()
	return n, err
}

// setTable replaces the live table (a terminal only).
func (p *printer) setTable(lines []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.erase()
	p.table = lines
	p.draw()
}

// done leaves the last table on screen and stops tracking it.
func (p *printer) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drawn, p.table = 0, nil
}

func (p *printer) erase() {
	if p.tty && p.drawn > 0 {
		fmt.Fprintf(p.w, "\x1b[%dA\x1b[J", p.drawn)
		p.drawn = 0
	}
}

func (p *printer) draw() {
	if !p.tty {
		return
	}
	for _, l := range p.table {
		fmt.Fprintln(p.w, l)
	}
	p.drawn = len(p.table)
}

// sample is the global customer's lease state at one moment.
type sample struct {
	at       time.Duration // since the start of the run
	share    [2]int64      // Σ shares held in each region, tokens per window
	leased   [2]int
	fallback [2]int
	sent     [2]int64 // the partner's requests to each region so far
}

// monitor samples the fleet while the clients run and draws the progress.
type monitor struct {
	f       *fleet
	clients []*client
	out     *printer
	global  string // the global rule's id

	mu      sync.Mutex
	samples []sample
}

// run samples every 500ms; it refreshes the table every second on a
// terminal and prints a line every 5 s elsewhere, until ctx ends.
func (m *monitor) run(ctx context.Context, start time.Time) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	ticks := 0
	for {
		select {
		case <-ctx.Done():
			m.take(start)
			if m.out.tty {
				m.out.setTable(m.table(start))
				m.out.done()
			}
			return
		case <-t.C:
		}
		ticks++
		m.take(start)
		switch {
		case m.out.tty && ticks%2 == 0:
			m.out.setTable(m.table(start))
		case !m.out.tty && ticks%10 == 0:
			m.out.event("%s", m.line())
		}
	}
}

// take records one sample of the global customer's shares. A lease is the
// region's, held by the identity's owner; a node that has just stopped
// owning it still shows it until its next report, so a region's share is
// the largest any of its nodes shows (the demo has one global identity),
// not their sum.
func (m *monitor) take(start time.Time) {
	s := sample{at: time.Since(start)}
	for _, g := range m.f.gateways() {
		ri := m.f.regionIndex(g.region)
		for _, r := range ops.GlobalStatus(g.node).Rules {
			if r.Rule == m.global {
				s.share[ri] = max(s.share[ri], r.Share)
				s.leased[ri] = max(s.leased[ri], r.Leased)
				s.fallback[ri] = max(s.fallback[ri], r.Fallback)
			}
		}
	}
	for _, c := range m.clients {
		if c.rule == m.global {
			for i := range s.sent {
				s.sent[i] += c.regionSent[i].Load()
			}
		}
	}
	m.mu.Lock()
	m.samples = append(m.samples, s)
	m.mu.Unlock()
}

func (m *monitor) last() sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.samples) == 0 {
		return sample{}
	}
	return m.samples[len(m.samples)-1]
}

// line is the plain progress line.
func (m *monitor) line() string {
	var sent, adm, rej int64
	for _, c := range m.clients {
		sent += c.sent.Load()
		adm += c.admitted.Load()
		rej += c.rejected.Load()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sent %d  admitted %d  rejected %d  |  nodes up %d/%d", sent, adm, rej, len(m.f.gateways()), len(m.f.nodeNames()))
	if m.f.clustered {
		lo, hi := m.f.rulesVersion()
		ldr, ok := m.f.leader()
		if !ok {
			ldr = "(none)"
		}
		s := m.last()
		fmt.Fprintf(&b, "  rules v%d", hi)
		if lo != hi {
			fmt.Fprintf(&b, " (some at v%d)", lo)
		}
		fmt.Fprintf(&b, "  lease leader %s  %s shares", ldr, m.global)
		for i, r := range m.f.regions {
			fmt.Fprintf(&b, " %s %d", r, s.share[i])
		}
	}
	fmt.Fprintf(&b, "  fail-open %d", failOpen(m.f))
	return b.String()
}

// table is the live table on a terminal.
func (m *monitor) table(start time.Time) []string {
	var out []string
	out = append(out, fmt.Sprintf("── t=%.0fs ─ %s", time.Since(start).Seconds(), strings.Repeat("─", 60)))
	out = append(out, fmt.Sprintf("%-9s %8s %9s %9s %7s   %s", "client", "sent", "admitted", "rejected", "adm/s", "regions (requests)"))
	el := max(time.Since(start).Seconds(), 0.001)
	for _, c := range m.clients {
		var regs []string
		for i, r := range m.f.regions {
			if n := c.regionSent[i].Load(); n > 0 {
				regs = append(regs, fmt.Sprintf("%s %d", r, n))
			}
		}
		out = append(out, fmt.Sprintf("%-9s %8d %9d %9d %7.1f   %s", c.name, c.sent.Load(), c.admitted.Load(), c.rejected.Load(),
			float64(c.admitted.Load())/el, strings.Join(regs, ", ")))
	}
	ldr, _ := m.f.leader()
	var nodes []string
	for _, name := range m.f.nodeNames() {
		g := m.f.get(name)
		if g == nil {
			nodes = append(nodes, name+" down")
			continue
		}
		role := ""
		switch {
		case name == ldr:
			role = " leader"
		case g.voter:
			role = " voter"
		}
		v := ""
		if m.f.clustered {
			v = fmt.Sprintf(" v%d", g.node.Status().RulesVersion)
		}
		nodes = append(nodes, fmt.Sprintf("%s%s%s", name, v, role))
	}
	out = append(out, "nodes: "+strings.Join(nodes, " · "))
	if m.f.clustered {
		s := m.last()
		var sh []string
		for i, r := range m.f.regions {
			sh = append(sh, fmt.Sprintf("%s %d (leased %d, fallback %d)", r, s.share[i], s.leased[i], s.fallback[i]))
		}
		out = append(out, fmt.Sprintf("%s shares: %s   fail-open %d", m.global, strings.Join(sh, ", "), failOpen(m.f)))
	}
	return out
}

// failOpen sums the fail-open (degraded) decisions of every node that ran.
func failOpen(f *fleet) uint64 {
	var n uint64
	for _, g := range f.all() {
		for _, rc := range ops.Counts(g.node) {
			n += rc.FailOpen
		}
	}
	return n
}
