// Package clientip finds the client IP address of an HTTP request, believing
// forwarding headers only when they were added by trusted proxies.
//
// The algorithm is the usual "rightmost untrusted" walk:
//
//  1. The peer is the address in http.Request.RemoteAddr. If the peer is not
//     trusted it is the client, and forwarding headers are ignored: a client
//     cannot choose its own address (and so its own rate-limit bucket).
//  2. Otherwise the hop list is read from the right: RFC 7239 Forwarded
//     ("for=" parameters) when that header is present, else X-Forwarded-For.
//     Trusted addresses are skipped; the first untrusted address is the
//     client. If every listed address is trusted, the leftmost one is used.
//  3. The walk stops early at an entry it cannot use: a malformed entry, an
//     "unknown" node or an obfuscated identifier such as "_hidden". The
//     result is then the nearest good address to the right of that entry,
//     that is, the hop that reported it (possibly the peer itself). Entries
//     to the left of a bad one were written by nobody we trust.
//  4. At most MaxHops entries are examined; a longer chain of trusted hops
//     yields the last one examined. Headers are scanned from the right
//     without allocation, so a huge header costs no more than MaxHops
//     entries (plus the length of one oversized entry, itself capped).
//
// All addresses are normalized: IPv4-mapped IPv6 addresses are unmapped and
// IPv6 zones are dropped.
//
// Usage:
//
//	r, err := clientip.NewResolver([]string{"10.0.0.0/8", "::1"})
//	if err != nil { ... }
//	ip, err := r.ClientIP(req.RemoteAddr, req.Header)
//	if err != nil { ... } // only when RemoteAddr is not an address
//
// Deployment note: because Forwarded takes precedence over X-Forwarded-For,
// trusted proxies that only append X-Forwarded-For must remove any Forwarded
// header sent by the client; otherwise the client's Forwarded header is
// believed as if a trusted proxy had written it.
package clientip
