package lease

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// This file encodes a Machine's replicated state for Raft snapshots. The
// encoding is versioned and deterministic: maps are written in sorted key
// order, so equal states encode to equal bytes on every replica.
//
//	"WLS" version(1)
//	now guard (varint) epoch (uvarint)
//	regions: count, each a string                     (must match Config)
//	rules: count, each id limit window burst maxCost  (sorted by id)
//	seqs: count, each reporter seq                    (sorted by reporter)
//	keys: count, each rule identity, then per region  (sorted by rule, identity)
//	      share epoch expiry hold release relTo relEp demand seen
//
// Integers are varints (signed) or uvarints (counts, epochs, sequences);
// strings are a uvarint length and the bytes.

const (
	stateMagic   = "WLS"
	stateVersion = 1
)

// ErrBadState is wrapped by every error RestoreState returns for bytes it
// cannot read.
var ErrBadState = errors.New("lease: malformed state")

// MarshalState encodes the machine's replicated state (not its Config) in a
// versioned, deterministic form: two machines in the same state give the
// same bytes.
func (m *Machine) MarshalState() []byte {
	var w stateWriter
	w.buf.WriteString(stateMagic)
	w.buf.WriteByte(stateVersion)
	w.int(m.now)
	w.int(m.guard)
	w.uint(m.epoch)
	w.uint(uint64(len(m.cfg.Regions)))
	for _, r := range m.cfg.Regions {
		w.str(r)
	}
	ids := slices.Sorted(maps.Keys(m.rules))
	w.uint(uint64(len(ids)))
	for _, id := range ids {
		r := m.rules[id]
		w.str(r.ID)
		w.int(r.Limit)
		w.int(int64(r.Window))
		w.int(r.Burst)
		w.int(r.MaxCost)
	}
	reporters := slices.Sorted(maps.Keys(m.seqs))
	w.uint(uint64(len(reporters)))
	for _, name := range reporters {
		w.str(name)
		w.uint(m.seqs[name])
	}
	keys := slices.SortedFunc(maps.Keys(m.keys), func(a, b key) int {
		return cmp.Or(cmp.Compare(a.rule, b.rule), cmp.Compare(a.identity, b.identity))
	})
	w.uint(uint64(len(keys)))
	for _, k := range keys {
		w.str(k.rule)
		w.str(k.identity)
		for _, l := range m.keys[k].regions {
			w.int(l.share)
			w.uint(l.epoch)
			w.int(l.expiry)
			w.int(l.hold)
			w.int(l.release)
			w.int(l.relTo)
			w.uint(l.relEp)
			w.int(l.demand)
			w.int(l.seen)
		}
	}
	return w.buf.Bytes()
}

// RestoreState replaces the machine's replicated state with one that
// MarshalState encoded. The machine's Config must name the same regions as
// the encoder's. On error (wrapping ErrBadState) the machine is unchanged.
func (m *Machine) RestoreState(b []byte) error {
	s, err := decodeState(b)
	if err != nil {
		return err
	}
	if !slices.Equal(s.regions, m.cfg.Regions) {
		return fmt.Errorf("%w: regions %q, but this machine has %q", ErrBadState, s.regions, m.cfg.Regions)
	}
	for _, id := range slices.Sorted(maps.Keys(s.rules)) {
		if err := m.ValidateRule(s.rules[id]); err != nil {
			return fmt.Errorf("%w: %w", ErrBadState, err)
		}
	}
	m.now, m.guard, m.epoch, m.rules, m.seqs, m.keys = s.now, s.guard, s.epoch, s.rules, s.seqs, s.keys
	return nil
}

// state is a decoded MarshalState.
type state struct {
	now, guard int64
	epoch      uint64
	regions    []string
	rules      map[string]Rule
	seqs       map[string]uint64
	keys       map[key]*keyState
}

// decodeState reads MarshalState's encoding; it never panics.
func decodeState(b []byte) (*state, error) {
	r := stateReader{b: b}
	if !bytes.HasPrefix(b, []byte(stateMagic)) || len(b) < len(stateMagic)+1 {
		return nil, fmt.Errorf("%w: not a lease state", ErrBadState)
	}
	if v := b[len(stateMagic)]; v != stateVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrBadState, v, stateVersion)
	}
	r.b = b[len(stateMagic)+1:]
	s := &state{rules: map[string]Rule{}, seqs: map[string]uint64{}, keys: map[key]*keyState{}}
	s.now, s.guard, s.epoch = r.int(), r.int(), r.uint()
	nr := r.count()
	for range nr {
		s.regions = append(s.regions, r.str())
	}
	if r.err == nil && nr == 0 {
		r.fail("no regions")
	}
	for range r.count() {
		rule := Rule{ID: r.str(), Limit: r.int(), Window: time.Duration(r.int()), Burst: r.int(), MaxCost: r.int()}
		if _, dup := s.rules[rule.ID]; dup && r.err == nil {
			r.fail(fmt.Sprintf("rule %q twice", rule.ID))
		}
		s.rules[rule.ID] = rule
	}
	for range r.count() {
		name, seq := r.str(), r.uint()
		if _, dup := s.seqs[name]; dup && r.err == nil {
			r.fail(fmt.Sprintf("reporter %q twice", name))
		}
		s.seqs[name] = seq
	}
	for range r.count() {
		k := key{r.str(), r.str()}
		ks := &keyState{regions: make([]regionLease, 0, min(nr, 64))}
		for range nr {
			ks.regions = append(ks.regions, regionLease{share: r.int(), epoch: r.uint(), expiry: r.int(), hold: r.int(),
				release: r.int(), relTo: r.int(), relEp: r.uint(), demand: r.int(), seen: r.int()})
			if r.err != nil {
				break
			}
		}
		if _, dup := s.keys[k]; dup && r.err == nil {
			r.fail(fmt.Sprintf("key %s/%q twice", k.rule, k.identity))
		}
		s.keys[k] = ks
		if r.err != nil {
			break
		}
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail(fmt.Sprintf("%d bytes left over", len(r.b)))
	}
	if r.err != nil {
		return nil, r.err
	}
	return s, nil
}

type stateWriter struct {
	buf bytes.Buffer
	tmp [binary.MaxVarintLen64]byte
}

func (w *stateWriter) int(v int64)   { w.buf.Write(binary.AppendVarint(w.tmp[:0], v)) }
func (w *stateWriter) uint(v uint64) { w.buf.Write(binary.AppendUvarint(w.tmp[:0], v)) }
func (w *stateWriter) str(s string) {
	w.uint(uint64(len(s)))
	w.buf.WriteString(s)
}

// stateReader reads varints and strings; after the first error every read
// returns zero and the error stays.
type stateReader struct {
	b   []byte
	err error
}

func (r *stateReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrBadState, what)
	}
	r.b = nil
}

func (r *stateReader) int() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("truncated or overlong integer")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *stateReader) uint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("truncated or overlong integer")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a count, refusing one larger than the bytes left could hold
// (every element takes at least one byte), so a corrupt count cannot make
// the decoder allocate or loop without bound.
func (r *stateReader) count() int {
	v := r.uint()
	if v > uint64(len(r.b)) {
		r.fail(fmt.Sprintf("count %d exceeds the %d bytes left", v, len(r.b)))
		return 0
	}
	return int(v)
}

func (r *stateReader) str() string {
	n := r.count()
	if r.err != nil {
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}
