package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// MetaMaxSize is the largest encoded Meta, in bytes. It is memberlist's own
// limit on node metadata (memberlist.MetaMaxSize).
const MetaMaxSize = 512

// metaFormatV1 is the leading format byte of the only encoding defined so far.
const metaFormatV1 byte = 1

// ErrMalformedMeta is wrapped by every error UnmarshalBinary returns, so that
// callers can count bad peer metadata with errors.Is.
var ErrMalformedMeta = errors.New("cluster: malformed node metadata")

// Meta is the metadata a node gossips about itself: its region, the address
// of its peer RPC server and the version of the rule set it enforces. The zero
// Meta is valid and encodes to 4 bytes.
type Meta struct {
	// Region names the node's region; per-region limits group nodes by it.
	Region string
	// RPCAddr is the "host:port" of the node's peer RPC server; empty if none.
	RPCAddr string
	// RulesVersion is the version of the rule set the node has in force.
	RulesVersion uint64
}

// MarshalBinary encodes m as the format byte 1 followed by the length-prefixed
// Region, the length-prefixed RPCAddr and RulesVersion, every integer an
// unsigned varint of minimal length. The encoding is canonical: equal Metas
// give equal bytes. It fails if the result would exceed MetaMaxSize bytes.
func (m Meta) MarshalBinary() ([]byte, error) {
	n := 1 + uvarintLen(uint64(len(m.Region))) + len(m.Region) +
		uvarintLen(uint64(len(m.RPCAddr))) + len(m.RPCAddr) +
		uvarintLen(m.RulesVersion)
	if n > MetaMaxSize {
		return nil, fmt.Errorf("cluster: node metadata is %d bytes encoded, over the %d-byte limit (region %d bytes, rpc addr %d bytes)",
			n, MetaMaxSize, len(m.Region), len(m.RPCAddr))
	}
	b := make([]byte, 0, n)
	b = append(b, metaFormatV1)
	b = binary.AppendUvarint(b, uint64(len(m.Region)))
	b = append(b, m.Region...)
	b = binary.AppendUvarint(b, uint64(len(m.RPCAddr)))
	b = append(b, m.RPCAddr...)
	b = binary.AppendUvarint(b, m.RulesVersion)
	return b, nil
}

// UnmarshalBinary decodes the output of MarshalBinary into m. It rejects,
// with an error wrapping ErrMalformedMeta and leaving m unchanged, input that
// is empty, longer than MetaMaxSize, of an unknown format, truncated, has
// trailing bytes or uses a non-minimal varint. It never panics.
//
// A later format must use a new format byte; nodes that do not know it will
// reject it, so during a rolling upgrade every node keeps sending format 1
// until all of them can read the new one.
func (m *Meta) UnmarshalBinary(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: empty", ErrMalformedMeta)
	}
	if len(b) > MetaMaxSize {
		return fmt.Errorf("%w: %d bytes, over the %d-byte limit", ErrMalformedMeta, len(b), MetaMaxSize)
	}
	if b[0] != metaFormatV1 {
		return fmt.Errorf("%w: unknown format byte %d (this node reads format %d)", ErrMalformedMeta, b[0], metaFormatV1)
	}
	d := metaDecoder{b: b, off: 1}
	region := d.str("region")
	rpc := d.str("rpc addr")
	version := d.uvarint("rules version")
	if d.err != nil {
		return d.err
	}
	if d.off != len(b) {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformedMeta, len(b)-d.off)
	}
	*m = Meta{Region: region, RPCAddr: rpc, RulesVersion: version}
	return nil
}

// metaDecoder reads fields in order and keeps the first error.
type metaDecoder struct {
	b   []byte
	off int
	err error
}

func (d *metaDecoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	switch {
	case n == 0:
		d.err = fmt.Errorf("%w: truncated %s at byte %d", ErrMalformedMeta, field, d.off)
		return 0
	case n < 0:
		d.err = fmt.Errorf("%w: %s at byte %d overflows 64 bits", ErrMalformedMeta, field, d.off)
		return 0
	case n != uvarintLen(v):
		d.err = fmt.Errorf("%w: %s at byte %d is not a minimal varint", ErrMalformedMeta, field, d.off)
		return 0
	}
	d.off += n
	return v
}

func (d *metaDecoder) str(field string) string {
	n := d.uvarint(field + " length")
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)-d.off) {
		d.err = fmt.Errorf("%w: %s is %d bytes but only %d remain", ErrMalformedMeta, field, n, len(d.b)-d.off)
		return ""
	}
	s := string(d.b[d.off : d.off+int(n)])
	d.off += int(n)
	return s
}

// uvarintLen is the length of v as a minimal unsigned varint.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
