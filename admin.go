package weir

import (
	"encoding/json"
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
	Source string  `json:"source,omitempty"`
	Count  float64 `json:"count"`
}

// TopThrottled returns the identities most rejected recently, per rule,
// highest first.
func (n *Node) TopThrottled() []Hitter { return toHitters(n.throttled.Top(n.now())) }

// TopShadowRejected returns the identities that shadow rules would have
// rejected most recently, highest first.
func (n *Node) TopShadowRejected() []Hitter { return toHitters(n.shadowed.Top(n.now())) }

func toHitters(es []hitters.Entry) []Hitter {
	out := make([]Hitter, 0, len(es))
	for _, e := range es {
		rule, id, _ := strings.Cut(e.Key, " ")
		src, v := splitTagged(id)
		out = append(out, Hitter{Rule: rule, Identity: v, Source: src, Count: e.Count})
	}
	return out
}

// adminReport is the JSON served by AdminHandler.
type adminReport struct {
	Status         Status       `json:"status"`
	Counts         []RuleCounts `json:"counts"`
	TopThrottled   []Hitter     `json:"top_throttled"`
	TopShadow      []Hitter     `json:"top_shadow_rejected"`
	KeyStoreCounts []StoreStats `json:"stores"`
}

// AdminHandler serves, as JSON on GET, the node's rule status, the decision
// counts per rule, the top throttled identities, the top identities shadow
// rules would have rejected, and the key stores' sizes. It names
// identities: on a node with Config.Lease.AdminTokens it authenticates
// every request as RulesAdminHandler does (401 otherwise, logged and
// counted with the rules API's refusals); elsewhere mount it behind a
// raftgroup.Guard, or where only operators reach it (docs/security.md).
func (n *Node) AdminHandler() http.Handler {
	return n.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeProblem(w, http.StatusMethodNotAllowed, problem{Title: "Method Not Allowed", Status: http.StatusMethodNotAllowed,
				Detail: "the admin report is read-only: use GET"})
			return
		}
		rep := adminReport{
			Status:         n.Status(),
			Counts:         n.Counts(),
			TopThrottled:   n.TopThrottled(),
			TopShadow:      n.TopShadowRejected(),
			KeyStoreCounts: n.stores.stats(),
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	}))
}

// guard puts h behind the rules API's door (Config.Lease.AdminTokens or a
// verified client certificate) when the node has one, else returns h.
func (n *Node) guard(h http.Handler) http.Handler {
	if n.lease != nil && n.lease.admin != nil {
		return n.lease.admin.Guard().Wrap(h)
	}
	return h
}

// AdminUnauthorized is the number of requests the node's admin door
// refused (RulesAdminHandler, AdminHandler and IdentityHandler together):
// zero on a node without Config.Lease.AdminTokens.
func (n *Node) AdminUnauthorized() uint64 {
	if n.lease != nil && n.lease.admin != nil {
		return n.lease.admin.Unauthorized()
	}
	return 0
}
