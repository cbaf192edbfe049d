package clientip

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// MaxHops is the largest number of forwarding-header entries (empty ones
// included) that ClientIP examines, counted from the right.
const MaxHops = 64

// maxElemLen caps the length of one header entry. A Forwarded element holds
// at most four short parameters; anything longer is treated as malformed, so
// scanning one entry is bounded too.
const maxElemLen = 1024

// ErrInvalidRemoteAddr is returned (wrapped, with the input) by ClientIP when
// remoteAddr is neither an IP address nor an IP address with a port.
var ErrInvalidRemoteAddr = errors.New("clientip: invalid remote address")

// Resolver decides which address of a request is its client's. It is
// immutable after NewResolver and safe for concurrent use. A nil *Resolver
// trusts nothing, so its ClientIP is always the peer address.
type Resolver struct {
	trusted []netip.Prefix
	header  string // "" = Forwarded when present, else X-Forwarded-For
}

// Only returns a copy of r that reads one forwarding header and ignores the
// other: "X-Forwarded-For" or "Forwarded". Use it when the trusted proxies
// write only that header, so a client cannot slip the other one past them.
// Any other name is an error.
func (r *Resolver) Only(header string) (*Resolver, error) {
	switch http.CanonicalHeaderKey(header) {
	case "X-Forwarded-For":
		header = "X-Forwarded-For"
	case "Forwarded":
		header = "Forwarded"
	default:
		return nil, fmt.Errorf("clientip: header %q: must be X-Forwarded-For or Forwarded", header)
	}
	c := *r
	c.header = header
	return &c, nil
}

// NewResolver returns a Resolver that believes forwarding headers from the
// given proxies. Each entry is a CIDR prefix ("10.0.0.0/8", "fd00::/8") or a
// bare IP address ("127.0.0.1", "::1"); surrounding spaces are ignored, host
// bits of a prefix are cleared, zones are dropped, and IPv4-mapped IPv6
// entries ("::ffff:10.0.0.0/104") become IPv4 ones. IPv4 addresses are matched
// only by IPv4 entries. The error names the first bad entry. An empty list
// yields a Resolver that trusts nothing.
func NewResolver(trusted []string) (*Resolver, error) {
	r := &Resolver{trusted: make([]netip.Prefix, 0, len(trusted))}
	for i, s := range trusted {
		p, err := parseTrusted(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("clientip: trusted[%d] %q: %w", i, s, err)
		}
		r.trusted = append(r.trusted, p)
	}
	return r, nil
}

func parseTrusted(s string) (netip.Prefix, error) {
	if s == "" {
		return netip.Prefix{}, errors.New("empty entry")
	}
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		a = normalize(a)
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}

// Trusted reports whether a lies in one of the trusted prefixes, after
// unmapping and dropping any zone. The zero Addr is never trusted.
func (r *Resolver) Trusted(a netip.Addr) bool {
	if r == nil || !a.IsValid() {
		return false
	}
	a = normalize(a)
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientIP returns the client address of a request that arrived from
// remoteAddr (http.Request.RemoteAddr: "host:port", "[v6]:port" or a bare IP)
// with headers h (canonical keys, as net/http provides them). See the package
// documentation for the algorithm. The result is always normalized and is
// either remoteAddr's address or one that appears in h. The only error is
// ErrInvalidRemoteAddr; headers never cause an error.
func (r *Resolver) ClientIP(remoteAddr string, h http.Header) (netip.Addr, error) {
	peer, err := parseRemoteAddr(remoteAddr)
	if err != nil {
		return netip.Addr{}, err
	}
	if !r.Trusted(peer) {
		return peer, nil
	}
	switch r.header {
	case "Forwarded":
		return r.walk(peer, h["Forwarded"], true), nil
	case "X-Forwarded-For":
		return r.walk(peer, h["X-Forwarded-For"], false), nil
	}
	if lines := h["Forwarded"]; len(lines) > 0 {
		return r.walk(peer, lines, true), nil
	}
	return r.walk(peer, h["X-Forwarded-For"], false), nil
}

func parseRemoteAddr(s string) (netip.Addr, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalize(ap.Addr()), nil
	}
	t := s
	if len(t) >= 2 && t[0] == '[' && t[len(t)-1] == ']' {
		t = t[1 : len(t)-1]
	}
	a, err := netip.ParseAddr(t)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w %q", ErrInvalidRemoteAddr, s)
	}
	return normalize(a), nil
}

// walk reads the hop list right to left: the last line first, and within a
// line the last entry first. forwarded selects RFC 7239 element syntax (with
// quoted strings) over plain X-Forwarded-For entries.
func (r *Resolver) walk(peer netip.Addr, lines []string, forwarded bool) netip.Addr {
	last := peer // nearest good address to the right of the current entry
	examined := 0
	for li := len(lines) - 1; li >= 0; li-- {
		s := lines[li]
		for more := true; more; {
			if examined == MaxHops {
				return last
			}
			examined++
			var elem string
			var ok bool
			s, elem, more, ok = cutLast(s, forwarded)
			if !ok {
				return last
			}
			elem = trimOWS(elem)
			if elem == "" {
				// RFC 9110 list syntax allows empty elements; they carry no hop.
				continue
			}
			var a netip.Addr
			if forwarded {
				a, ok = parseForwardedElem(elem)
			} else {
				a, ok = parseNode(elem)
			}
			if !ok {
				return last
			}
			if !r.Trusted(a) {
				return a
			}
			last = a
		}
	}
	return last
}

// cutLast splits off the rightmost comma-separated entry of s. more reports
// whether rest still holds entries (a comma was found). With quotes, commas
// inside quoted strings do not separate entries; scanning from the right, a
// quote preceded by an odd number of backslashes is escaped. ok is false for
// an unterminated quoted string or an entry longer than maxElemLen.
func cutLast(s string, quotes bool) (rest, elem string, more, ok bool) {
	inQuote := false
	for i := len(s) - 1; i >= 0; i-- {
		if len(s)-i > maxElemLen+1 {
			return "", "", false, false
		}
		c := s[i]
		switch {
		case !inQuote && c == ',':
			return s[:i], s[i+1:], true, true
		case quotes && c == '"':
			if !inQuote {
				inQuote = true
			} else if backslashesBefore(s, i)%2 == 0 {
				inQuote = false
			}
		}
	}
	if inQuote || len(s) > maxElemLen {
		return "", "", false, false
	}
	return "", s, false, true
}

func backslashesBefore(s string, i int) int {
	n := 0
	for i--; i >= 0 && s[i] == '\\'; i-- {
		n++
	}
	return n
}

// parseForwardedElem returns the address of the for= parameter of one
// RFC 7239 forwarded-element. It fails on syntax errors, on a missing or
// repeated for=, and when the node is "unknown" or obfuscated. Quoted pairs
// are accepted in other parameters but not in for=, where a valid node never
// needs them.
func parseForwardedElem(elem string) (netip.Addr, bool) {
	var node string
	found := false
	for elem != "" {
		pair, rest, ok := cutPair(elem)
		if !ok {
			return netip.Addr{}, false
		}
		elem = rest
		pair = trimOWS(pair)
		if pair == "" {
			continue
		}
		name, val, ok := strings.Cut(pair, "=")
		if !ok || !isToken(name) || val == "" {
			return netip.Addr{}, false
		}
		escaped := false
		if val[0] == '"' {
			// cutPair guarantees the quote is closed at the end of val.
			if len(val) < 2 || val[len(val)-1] != '"' {
				return netip.Addr{}, false
			}
			val = val[1 : len(val)-1]
			escaped = strings.IndexByte(val, '\\') >= 0
		} else if !isLenientToken(val) {
			return netip.Addr{}, false
		}
		if strings.EqualFold(name, "for") {
			if found || escaped {
				return netip.Addr{}, false
			}
			found, node = true, val
		}
	}
	if !found {
		return netip.Addr{}, false
	}
	return parseNode(node)
}

// cutPair splits elem at its first ';' outside a quoted string. ok is false
// if a quoted string is left open or a quote appears in the middle of a
// value.
func cutPair(elem string) (pair, rest string, ok bool) {
	inQuote := false
	for i := 0; i < len(elem); i++ {
		c := elem[i]
		switch {
		case inQuote && c == '\\':
			i++ // skip the escaped byte
		case c == '"':
			if !inQuote && (i == 0 || elem[i-1] != '=') {
				return "", "", false
			}
			if inQuote && i+1 < len(elem) && elem[i+1] != ';' && elem[i+1] != ' ' && elem[i+1] != '\t' {
				return "", "", false
			}
			inQuote = !inQuote
		case !inQuote && c == ';':
			return elem[:i], elem[i+1:], true
		}
	}
	if inQuote {
		return "", "", false
	}
	return elem, "", true
}

// parseNode parses an RFC 7239 node or an X-Forwarded-For entry: an IPv4
// address, a bare or bracketed IPv6 address, each with an optional port
// (numeric or obfuscated). "unknown" and obfuscated names ("_hidden") fail,
// as does anything else that is not an address.
func parseNode(s string) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, false
	}
	// Pick the form before parsing: a failed netip parse allocates its error.
	var host, port string
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		host, port = s[1:end], s[end+1:]
		if port != "" {
			if port[0] != ':' {
				return netip.Addr{}, false
			}
			port = port[1:]
			if !validPort(port) {
				return netip.Addr{}, false
			}
		}
	} else if i := strings.IndexByte(s, ':'); i >= 0 && i == strings.LastIndexByte(s, ':') {
		host, port = s[:i], s[i+1:]
		if !validPort(port) {
			return netip.Addr{}, false
		}
	} else {
		host = s // IPv4 or bare IPv6 (with an optional zone)
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	if port != "" && s[0] != '[' && !a.Is4() {
		return netip.Addr{}, false // only IPv4 takes a port without brackets
	}
	return normalize(a), true
}

// validPort accepts a decimal port (1 to 5 digits) or an RFC 7239 obfport.
func validPort(p string) bool {
	if p == "" {
		return false
	}
	if p[0] == '_' {
		for i := 1; i < len(p); i++ {
			c := p[i]
			if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
				return false
			}
		}
		return len(p) > 1
	}
	if len(p) > 5 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}

func normalize(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}

func trimOWS(s string) string {
	return strings.Trim(s, " \t")
}

func isAlnum(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

func isTchar(c byte) bool {
	return isAlnum(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isTchar(s[i]) {
			return false
		}
	}
	return true
}

// isLenientToken is isToken plus ':', '[' and ']', which RFC 7239 requires to
// be quoted but some proxies send bare ("for=[::1]", "for=192.0.2.1:80").
func isLenientToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isTchar(c) && c != ':' && c != '[' && c != ']' {
			return false
		}
	}
	return s != ""
}
