package weir

import (
	"net/http"
	"strings"

	"github.com/weir-dev/weir/internal/hitters"
)

// Hitter is one entry of a top-identities list: a rule and an identity, with
// a decayed count of its recent rejections (an estimate that never
// undercounts; counts halve every minute).
type Hitter struct {
	Rule     string `json:"rule"`
	Identity string `json:"identity"`
	// Source is the source of the rule's key chain that yielded Identity
	// ("ip", "user", "header:X-User") when it is not the chain's first,
	// under key format 2 (docs/security.md, "Identity namespaces"); empty
	// for the first source. IdentityQuery.Key takes it as it is.
	Source string `json:"source,omitempty"`
	// Count is the identity's recent rejections (or shadow rejections),
	// each counting 1 and halving every minute since: an estimate, never
	// below that decayed count and possibly above it, so 3 rejections
	// a few seconds ago read about 2.9. Round it to show it as a count.
	Count float64 `json:"count"`
}

// topThrottled returns the identities most rejected recently, per rule,
// highest first.
func (n *Node) topThrottled() []Hitter { return toHitters(n.throttled.Top(n.now())) }

// topShadowRejected returns the identities that shadow rules would have
// rejected most recently, highest first.
func (n *Node) topShadowRejected() []Hitter { return toHitters(n.shadowed.Top(n.now())) }

func toHitters(es []hitters.Entry) []Hitter {
	out := make([]Hitter, 0, len(es))
	for _, e := range es {
		rule, id, _ := strings.Cut(e.Key, " ")
		src, v := splitTagged(id)
		out = append(out, Hitter{Rule: rule, Identity: v, Source: src, Count: e.Count})
	}
	return out
}

// guard puts h behind the rules API's door (Config.Lease.AdminTokens or a
// verified client certificate) when the node has one, else returns h.
func (n *Node) guard(h http.Handler) http.Handler {
	if n.lease != nil && n.lease.admin != nil {
		return n.lease.admin.Guard().Wrap(h)
	}
	return h
}

// adminUnauthorized is the number of requests the node's admin door
// refused (RulesAdminHandler, AdminHandler and IdentityHandler together):
// zero on a node without Config.Lease.AdminTokens.
func (n *Node) adminUnauthorized() uint64 {
	if n.lease != nil && n.lease.admin != nil {
		return n.lease.admin.Unauthorized()
	}
	return 0
}
