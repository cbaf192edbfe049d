package cluster

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestMetaRoundTrip(t *testing.T) {
	cases := []Meta{
		{},
		{Region: "eu-west", RPCAddr: "127.0.0.1:7001", RulesVersion: 42},
		{Region: "us", RulesVersion: math.MaxUint64},
		{RPCAddr: "[::1]:9000"},
		{Region: strings.Repeat("r", 200), RPCAddr: strings.Repeat("a", 200), RulesVersion: 1 << 40},
	}
	for _, want := range cases {
		b, err := want.MarshalBinary()
		if err != nil {
			t.Fatalf("MarshalBinary(%+v): %v", want, err)
		}
		if len(b) > MetaMaxSize {
			t.Fatalf("MarshalBinary(%+v) = %d bytes, over the limit", want, len(b))
		}
		if b[0] != metaFormatV1 {
			t.Fatalf("format byte = %d, want %d", b[0], metaFormatV1)
		}
		var got Meta
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("UnmarshalBinary(%x): %v", b, err)
		}
		if got != want {
			t.Fatalf("round trip: got %+v, want %+v", got, want)
		}
	}
}

func TestMetaEncodingIsCompact(t *testing.T) {
	b, err := Meta{Region: "eu", RPCAddr: "10.0.0.1:7001", RulesVersion: 3}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	// format + (1+2) + (1+13) + 1
	if len(b) != 19 {
		t.Fatalf("encoded length = %d, want 19: %x", len(b), b)
	}
}

func TestMetaMarshalOversized(t *testing.T) {
	// 1 + 2 + 300 + 2 + 205 + 1 = 511 fits; one more byte does not.
	fits := Meta{Region: strings.Repeat("r", 300), RPCAddr: strings.Repeat("a", 205)}
	b, err := fits.MarshalBinary()
	if err != nil || len(b) != 511 {
		t.Fatalf("MarshalBinary(511-byte meta) = %d bytes, %v", len(b), err)
	}
	fits.RPCAddr += "a"
	if b, err = fits.MarshalBinary(); err != nil || len(b) != MetaMaxSize {
		t.Fatalf("MarshalBinary(512-byte meta) = %d bytes, %v", len(b), err)
	}
	fits.RPCAddr += "a"
	if _, err := fits.MarshalBinary(); err == nil || !strings.Contains(err.Error(), "512-byte limit") {
		t.Fatalf("MarshalBinary(513-byte meta) error = %v, want the limit named", err)
	}
}

func TestMetaUnmarshalMalformed(t *testing.T) {
	valid, err := Meta{Region: "eu", RPCAddr: "h:1", RulesVersion: 300}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		in   []byte
		want string
	}{
		{"nil", nil, "empty"},
		{"empty", []byte{}, "empty"},
		{"format 0", []byte{0, 0, 0, 0}, "unknown format byte 0"},
		{"format 2", append([]byte{2}, valid[1:]...), "unknown format byte 2"},
		{"only format", []byte{1}, "truncated region length"},
		{"truncated region", valid[:3], "region is 2 bytes but only 1 remain"},
		{"truncated rpc length", valid[:4], "truncated rpc addr length"},
		{"truncated rpc", valid[:6], "rpc addr is 3 bytes but only 1 remain"},
		{"truncated version", valid[:len(valid)-1], "truncated rules version"},
		{"trailing", append(append([]byte{}, valid...), 0), "1 trailing bytes"},
		{"huge length", []byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0}, "only 2 remain"},
		{"overflow", []byte{1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, "overflows 64 bits"},
		{"non-minimal varint", []byte{1, 0x80, 0x00, 0, 0}, "not a minimal varint"},
		{"oversized", append([]byte{1}, make([]byte, MetaMaxSize)...), "over the 512-byte limit"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := Meta{Region: "keep"}
			err := m.UnmarshalBinary(tc.in)
			if err == nil {
				t.Fatalf("UnmarshalBinary(%x) = nil error, want %q", tc.in, tc.want)
			}
			if !errors.Is(err, ErrMalformedMeta) {
				t.Fatalf("error %v does not wrap ErrMalformedMeta", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
			if m != (Meta{Region: "keep"}) {
				t.Fatalf("UnmarshalBinary changed m on error: %+v", m)
			}
		})
	}
}

// TestMetaRoundTripProperty checks, over random Metas, that decoding inverts
// encoding and that the encoding is canonical.
func TestMetaRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := Meta{
			Region:       rapid.StringN(0, 40, 200).Draw(t, "region"),
			RPCAddr:      rapid.StringN(0, 40, 200).Draw(t, "rpc"),
			RulesVersion: rapid.Uint64().Draw(t, "version"),
		}
		b, err := m.MarshalBinary()
		if err != nil {
			if len(m.Region)+len(m.RPCAddr) < MetaMaxSize-30 {
				t.Fatalf("MarshalBinary(%+v): %v", m, err)
			}
			return
		}
		var got Meta
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("UnmarshalBinary(%x): %v", b, err)
		}
		if got != m {
			t.Fatalf("round trip: got %+v, want %+v", got, m)
		}
	})
}

// FuzzMetaUnmarshal feeds arbitrary bytes to UnmarshalBinary: it must never
// panic, and whatever it accepts must re-encode to the very same bytes.
func FuzzMetaUnmarshal(f *testing.F) {
	for _, m := range []Meta{{}, {Region: "eu", RPCAddr: "127.0.0.1:7001", RulesVersion: 7}, {RulesVersion: math.MaxUint64}} {
		b, err := m.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2, 0, 0, 0})
	f.Add([]byte{1, 0x80, 0x00, 0, 0})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Add(append([]byte{1}, make([]byte, MetaMaxSize)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Meta
		if err := m.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrMalformedMeta) {
				t.Fatalf("error %v does not wrap ErrMalformedMeta", err)
			}
			return
		}
		again, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("accepted %x but cannot re-encode %+v: %v", b, m, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("accepted %x but it re-encodes to %x", b, again)
		}
	})
}
