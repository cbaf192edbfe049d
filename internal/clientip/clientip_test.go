package clientip

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

var testTrusted = []string{"10.0.0.0/8", "127.0.0.1", "::1", "fd00::/8", "::ffff:192.168.0.0/112"}

func mustResolver(t testing.TB) *Resolver {
	t.Helper()
	r, err := NewResolver(testTrusted)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNewResolverErrors(t *testing.T) {
	for _, bad := range []string{"", "10.0.0.0/33", "10.0.0", "example.com", "::1/129", "1.2.3.4/8/9"} {
		_, err := NewResolver([]string{"10.0.0.0/8", bad})
		if err == nil {
			t.Errorf("NewResolver(%q): no error", bad)
			continue
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("trusted[1] %q", bad)) {
			t.Errorf("NewResolver(%q): error %q does not name the entry", bad, err)
		}
	}
}

func TestTrusted(t *testing.T) {
	r := mustResolver(t)
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"10.1.2.3", true},
		{"::ffff:10.1.2.3", true}, // mapped addresses are unmapped
		{"127.0.0.1", true},
		{"127.0.0.2", false},
		{"::1", true},
		{"fd12::1", true},
		{"fe80::1%eth0", false},
		{"192.168.3.4", true}, // from the mapped prefix entry
		{"11.0.0.1", false},
		{"::ffff:7f00:1", true},
	} {
		if got := r.Trusted(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("Trusted(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
	if r.Trusted(netip.Addr{}) {
		t.Error("zero Addr trusted")
	}
	var nilR *Resolver
	if nilR.Trusted(netip.MustParseAddr("10.0.0.1")) {
		t.Error("nil Resolver trusts")
	}
	zr, _ := NewResolver([]string{"fe80::1%eth0", " 10.9.9.9/8 "})
	if !zr.Trusted(netip.MustParseAddr("fe80::1")) || !zr.Trusted(netip.MustParseAddr("10.1.1.1")) {
		t.Error("zone or host bits not handled in trusted entries")
	}
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

const (
	fwd = "Forwarded"
	xff = "X-Forwarded-For"
)

func TestClientIP(t *testing.T) {
	r := mustResolver(t)
	for _, tc := range []struct {
		name   string
		remote string
		h      http.Header
		want   string
	}{
		// The peer.
		{"direct", "203.0.113.7:5555", nil, "203.0.113.7"},
		{"bare remote", "203.0.113.7", nil, "203.0.113.7"},
		{"v6 remote", "[2001:db8::7]:443", nil, "2001:db8::7"},
		{"mapped remote", "[::ffff:203.0.113.7]:1", nil, "203.0.113.7"},
		{"zoned remote", "[fe80::1%eth0]:1", nil, "fe80::1"},
		{"trusted peer no headers", "10.0.0.1:1", nil, "10.0.0.1"},

		// Spoofing: an untrusted peer's headers are ignored.
		{"spoof xff direct", "203.0.113.7:1", hdr(xff, "1.1.1.1"), "203.0.113.7"},
		{"spoof fwd direct", "203.0.113.7:1", hdr(fwd, "for=1.1.1.1"), "203.0.113.7"},
		{"spoof trusted-looking", "203.0.113.7:1", hdr(xff, "10.0.0.1"), "203.0.113.7"},
		// Spoofing through a proxy: the client's own prefix is not believed.
		{"spoof xff via proxy", "10.0.0.1:1", hdr(xff, "1.1.1.1, 203.0.113.7"), "203.0.113.7"},
		{"spoof xff trusted via proxy", "10.0.0.1:1", hdr(xff, "10.0.0.9, 203.0.113.7"), "203.0.113.7"},
		{"spoof xff lines", "10.0.0.1:1", hdr(xff, "1.1.1.1", xff, "203.0.113.7"), "203.0.113.7"},
		{"spoof fwd via proxy", "10.0.0.1:1", hdr(fwd, "for=1.1.1.1, for=203.0.113.7"), "203.0.113.7"},
		{"spoof unterminated quote", "10.0.0.1:1", hdr(fwd, `for="1.1.1.1`, fwd, "for=203.0.113.7"), "203.0.113.7"},
		{"spoof quote in one line", "10.0.0.1:1", hdr(fwd, `for="1.1.1.1, for=203.0.113.7`), "203.0.113.7"},
		{"spoof comma in quote", "10.0.0.1:1", hdr(fwd, `for=1.1.1.1;host="a, for=9.9.9.9", for=203.0.113.7`), "203.0.113.7"},

		// Chains.
		{"xff two proxies", "10.0.0.1:1", hdr(xff, "203.0.113.7, 10.0.0.2"), "203.0.113.7"},
		{"xff all trusted", "10.0.0.1:1", hdr(xff, "10.0.0.3, 10.0.0.2"), "10.0.0.3"},
		{"xff v6", "[::1]:1", hdr(xff, "2001:db8::1, fd00::2"), "2001:db8::1"},
		{"xff ports", "[::1]:1", hdr(xff, "[2001:db8::1]:99, 10.0.0.2:80"), "2001:db8::1"},
		{"xff v4 port", "[::1]:1", hdr(xff, "203.0.113.7:1234"), "203.0.113.7"},
		{"xff mapped", "[::1]:1", hdr(xff, "::ffff:203.0.113.7"), "203.0.113.7"},
		{"xff zone", "[::1]:1", hdr(xff, "fe80::9%en0"), "fe80::9"},
		{"xff empties", "[::1]:1", hdr(xff, ",, 203.0.113.7 ,,"), "203.0.113.7"},
		{"xff empty header", "[::1]:1", hdr(xff, ""), "::1"},
		{"mapped trusted peer", "[::ffff:10.0.0.1]:1", hdr(xff, "203.0.113.7"), "203.0.113.7"},

		// Forwarded.
		{"fwd quoted v6", "10.0.0.1:1", hdr(fwd, `for="[2001:db8:cafe::17]:4711"`), "2001:db8:cafe::17"},
		{"fwd bare v6 lenient", "10.0.0.1:1", hdr(fwd, `for=[2001:db8::17]`), "2001:db8::17"},
		{"fwd params", "10.0.0.1:1", hdr(fwd, `For="192.0.2.60:443";proto=http;by=203.0.113.43;host="a\"b"`), "192.0.2.60"},
		{"fwd chain", "10.0.0.1:1", hdr(fwd, `for=192.0.2.43, for=10.0.0.5;by=10.0.0.1`), "192.0.2.43"},
		{"fwd all trusted", "10.0.0.1:1", hdr(fwd, `for=10.0.0.9, for=10.0.0.5`), "10.0.0.9"},
		{"fwd precedence", "10.0.0.1:1", hdr(xff, "198.51.100.1", fwd, "for=192.0.2.43"), "192.0.2.43"},
		{"fwd obf port", "10.0.0.1:1", hdr(fwd, `for="192.0.2.43:_abc"`), "192.0.2.43"},
		{"fwd empty pairs", "10.0.0.1:1", hdr(fwd, `;for=192.0.2.43;;`), "192.0.2.43"},

		// Stops: unknown, obfuscated and malformed entries yield the hop to their right.
		{"fwd unknown", "10.0.0.1:1", hdr(fwd, `for=1.1.1.1, for=unknown, for=10.0.0.5`), "10.0.0.5"},
		{"fwd obfuscated", "10.0.0.1:1", hdr(fwd, `for=_hidden, for=10.0.0.5`), "10.0.0.5"},
		{"fwd obfuscated at peer", "10.0.0.1:1", hdr(fwd, `for="_gazonk"`), "10.0.0.1"},
		{"fwd no for", "10.0.0.1:1", hdr(fwd, `for=1.1.1.1, by=10.0.0.9`), "10.0.0.1"},
		{"fwd duplicate for", "10.0.0.1:1", hdr(fwd, `for=1.1.1.1;for=2.2.2.2`), "10.0.0.1"},
		{"fwd escaped for", "10.0.0.1:1", hdr(fwd, `for="1.1.1\.1"`), "10.0.0.1"},
		{"fwd space around =", "10.0.0.1:1", hdr(fwd, `for = 1.1.1.1`), "10.0.0.1"},
		{"fwd hostname", "10.0.0.1:1", hdr(fwd, `for=example.com, for=10.0.0.3`), "10.0.0.3"},
		{"fwd unbracketed v6 port", "10.0.0.1:1", hdr(fwd, `for="2001:db8::1:80"`), "2001:db8::1:80"},
		{"xff unknown", "10.0.0.1:1", hdr(xff, "1.1.1.1, unknown, 10.0.0.4"), "10.0.0.4"},
		{"xff garbage", "10.0.0.1:1", hdr(xff, "1.1.1.1, not-an-ip"), "10.0.0.1"},
		{"xff bad port", "10.0.0.1:1", hdr(xff, "1.1.1.1:99999999"), "10.0.0.1"},
		{"xff bad bracket", "10.0.0.1:1", hdr(xff, "[::1"), "10.0.0.1"},
		{"xff v6 without brackets and port", "10.0.0.1:1", hdr(xff, "::ffff:1.2.3.4:80"), "10.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.ClientIP(tc.remote, tc.h)
			if err != nil {
				t.Fatal(err)
			}
			if want := netip.MustParseAddr(tc.want); got != want {
				t.Errorf("ClientIP(%q, %v) = %v, want %v", tc.remote, tc.h, got, want)
			}
		})
	}
}

func TestClientIPBadRemote(t *testing.T) {
	r := mustResolver(t)
	for _, s := range []string{"", "@", "example.com:80", "1.2.3.4:", "[::1", "unknown"} {
		_, err := r.ClientIP(s, hdr(xff, "1.1.1.1"))
		if !errors.Is(err, ErrInvalidRemoteAddr) {
			t.Errorf("ClientIP(%q): err = %v, want ErrInvalidRemoteAddr", s, err)
		}
	}
}

// TestClientIPHopCap checks that a long chain of trusted hops stops at
// MaxHops, and that huge headers are examined only that far.
func TestClientIPHopCap(t *testing.T) {
	r := mustResolver(t)
	hops := make([]string, 200)
	for i := range hops {
		hops[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
	}
	got, _ := r.ClientIP("10.0.0.1:1", hdr(xff, "203.0.113.7, "+strings.Join(hops, ", ")))
	if want := netip.MustParseAddr(hops[200-MaxHops]); got != want {
		t.Errorf("capped chain: got %v, want %v", got, want)
	}

	// One MB of commas and one of trusted addresses: bounded time, no allocation per byte.
	huge := strings.Repeat(",", 1<<20) + "203.0.113.7"
	got, _ = r.ClientIP("10.0.0.1:1", hdr(xff, huge))
	if want := netip.MustParseAddr("203.0.113.7"); got != want {
		t.Errorf("trailing client after commas: got %v", got)
	}
	got, _ = r.ClientIP("10.0.0.1:1", hdr(xff, "203.0.113.7"+strings.Repeat(",", 1<<20)))
	if want := netip.MustParseAddr("10.0.0.1"); got != want {
		t.Errorf("client beyond the cap: got %v, want the peer", got)
	}
	longElem := `for="` + strings.Repeat("a", 1<<20) + `"`
	got, _ = r.ClientIP("10.0.0.1:1", hdr(fwd, "for=1.1.1.1, "+longElem))
	if want := netip.MustParseAddr("10.0.0.1"); got != want {
		t.Errorf("oversized element: got %v, want the peer", got)
	}
	allocs := testing.AllocsPerRun(10, func() {
		r.ClientIP("10.0.0.1:1", hdr(xff, huge))
	})
	if allocs > 10 {
		t.Errorf("huge header: %v allocations", allocs)
	}
}

// referenceClientIP is a plain implementation for well-formed X-Forwarded-For
// chains: split everything, walk from the right.
func referenceClientIP(r *Resolver, remote netip.Addr, xffLines []string) netip.Addr {
	if !r.Trusted(remote) {
		return remote
	}
	var hops []netip.Addr
	for _, l := range xffLines {
		for _, p := range strings.Split(l, ",") {
			if p = strings.TrimSpace(p); p != "" {
				hops = append(hops, normalize(netip.MustParseAddr(p)))
			}
		}
	}
	last := remote
	for i := len(hops) - 1; i >= 0 && len(hops)-i <= MaxHops; i-- {
		if !r.Trusted(hops[i]) {
			return hops[i]
		}
		last = hops[i]
	}
	return last
}

func TestClientIPMatchesReference(t *testing.T) {
	r := mustResolver(t)
	addrs := []string{"10.0.0.1", "10.2.3.4", "127.0.0.1", "::1", "fd00::5", "::ffff:10.0.0.8",
		"203.0.113.7", "198.51.100.2", "2001:db8::1", "::ffff:203.0.113.9", "192.168.1.1"}
	rapid.Check(t, func(t *rapid.T) {
		remote := rapid.SampledFrom(addrs).Draw(t, "remote")
		lines := rapid.SliceOfN(rapid.SliceOfN(rapid.SampledFrom(addrs), 1, 30), 0, 4).Draw(t, "lines")
		h := http.Header{}
		var raw []string
		for _, l := range lines {
			s := strings.Join(l, " , ")
			raw = append(raw, s)
			h.Add(xff, s)
		}
		ra := netip.MustParseAddr(remote)
		got, err := r.ClientIP(netip.AddrPortFrom(ra, 80).String(), h)
		if err != nil {
			t.Fatal(err)
		}
		if want := referenceClientIP(r, normalize(ra), raw); got != want {
			t.Fatalf("got %v, want %v", got, want)
		}
	})
}

// headerAddrs extracts every address-like token of the header values, used by
// the fuzz test to check that results are not invented.
func headerAddrs(h http.Header) map[netip.Addr]bool {
	set := map[netip.Addr]bool{}
	for _, vs := range h {
		for _, v := range vs {
			for _, tok := range strings.FieldsFunc(v, func(r rune) bool { return strings.ContainsRune(",;=\"[] \t%", r) }) {
				if a, err := netip.ParseAddr(tok); err == nil {
					set[normalize(a)] = true
				}
				if i := strings.LastIndexByte(tok, ':'); i >= 0 {
					if a, err := netip.ParseAddr(tok[:i]); err == nil {
						set[normalize(a)] = true
					}
				}
			}
		}
	}
	return set
}

func FuzzClientIP(f *testing.F) {
	seeds := []struct{ remote, fwd, xff string }{
		{"10.0.0.1:1", "", "203.0.113.7, 10.0.0.2"},
		{"10.0.0.1:1", `for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.3`, ""},
		{"10.0.0.1:1", `for=unknown, for=_hidden`, "1.1.1.1"},
		{"[::1]:1", `for="1.1.1.1, for=2.2.2.2`, ""},
		{"[::1]:1", `for=1.1.1.1;host="a\", for=2.2.2.2", for=fd00::1`, ""},
		{"[::ffff:10.0.0.1]:1", "", "::ffff:1.2.3.4, fe80::1%eth0"},
		{"203.0.113.7:1", "for=10.0.0.1", "10.0.0.1"},
		{"127.0.0.1", "", ",,,,"},
		{"", "", ""},
	}
	for _, s := range seeds {
		f.Add(s.remote, s.fwd, s.xff)
	}
	r, err := NewResolver(testTrusted)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, remote, fwdv, xffv string) {
		h := http.Header{}
		if fwdv != "" {
			for _, l := range strings.Split(fwdv, "\n") {
				h.Add(fwd, l)
			}
		}
		if xffv != "" {
			for _, l := range strings.Split(xffv, "\n") {
				h.Add(xff, l)
			}
		}
		got, err := r.ClientIP(remote, h)
		if err != nil {
			if !errors.Is(err, ErrInvalidRemoteAddr) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		peer, perr := parseRemoteAddr(remote)
		if perr != nil {
			t.Fatalf("ClientIP accepted %q but parseRemoteAddr did not", remote)
		}
		if got == peer {
			return
		}
		if !r.Trusted(peer) {
			t.Fatalf("untrusted peer %v, but result %v", peer, got)
		}
		if got != normalize(got) {
			t.Fatalf("result %v not normalized", got)
		}
		if !headerAddrs(h)[got] {
			t.Fatalf("result %v appears neither as remote %q nor in headers %q", got, remote, h)
		}
	})
}

func BenchmarkClientIP(b *testing.B) {
	r := mustResolver(b)
	cases := []struct {
		name, remote string
		h            http.Header
	}{
		{"direct", "203.0.113.7:5555", http.Header{}},
		{"xff=3", "10.0.0.1:1", hdr(xff, "203.0.113.7, 10.0.0.3, 10.0.0.2")},
		{"forwarded=3", "10.0.0.1:1", hdr(fwd, `for="[2001:db8::1]:80";proto=https, for=10.0.0.3, for=10.0.0.2`)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.ClientIP(c.remote, c.h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestOnly(t *testing.T) {
	r, err := NewResolver([]string{"10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Forwarded": {"for=192.0.2.1"}, "X-Forwarded-For": {"192.0.2.2"}}
	for _, tc := range []struct{ header, want string }{
		{"x-forwarded-for", "192.0.2.2"},
		{"Forwarded", "192.0.2.1"},
	} {
		o, err := r.Only(tc.header)
		if err != nil {
			t.Fatal(err)
		}
		got, err := o.ClientIP("10.0.0.1:80", h)
		if err != nil || got.String() != tc.want {
			t.Errorf("Only(%q): %v, %v; want %s", tc.header, got, err, tc.want)
		}
	}
	if _, err := r.Only("X-Real-IP"); err == nil {
		t.Error("Only accepted an unknown header")
	}
}
