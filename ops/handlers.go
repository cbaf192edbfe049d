package ops

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"

	"github.com/weir-dev/weir"
)

// uiAssets are the status page's files: plain HTML, JavaScript and CSS,
// nothing fetched from elsewhere.
//
//go:embed ui
var uiAssets embed.FS

// UIHandler serves the node's status page and the JSON it polls:
//
//	GET  /                       the page (embedded HTML, JavaScript, CSS)
//	GET  /ui/...                 its assets
//	GET  /v1/status              Overview as JSON
//	GET  /v1/identities/{id}     the identity lookup (IdentityHandler)
//	     /v1/rules, /v1/rules/…  the authenticated rules API (RulesAdminHandler)
//
// The page and its JSON use relative addresses, so the handler may be
// mounted under a prefix with http.StripPrefix. The status JSON names the
// top throttled identities and is not authenticated: mount the handler
// where only operators reach it. The identity lookup and the rules API
// authenticate every request on a node with weir.LeaseConfig.AdminTokens,
// as IdentityHandler and RulesAdminHandler do: the page asks the operator
// for a bearer token and sends it with each lookup and change, keeping it
// in the page's memory only (nothing is stored on the server or in the
// browser's storage).
func UIHandler(n *weir.Node) http.Handler {
	v := of(n)
	mux := http.NewServeMux()
	assets, err := fs.Sub(uiAssets, "ui")
	if err != nil {
		panic("weir/ops: embedded ui assets: " + err.Error()) // the embed directive guarantees the folder
	}
	files := http.FileServerFS(assets)
	mux.Handle("GET /ui/", noStore(http.StripPrefix("/ui/", files)))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-store")
		http.ServeFileFS(w, r, assets, "index.html")
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, v.Overview()) })
	mux.Handle("GET /v1/identities/{id...}", v.Guard(identity(v)))
	rules := v.RulesAdminHandler()
	mux.Handle("/v1/rules", rules)
	mux.Handle("/v1/rules/", rules)
	return mux
}

// RulesAdminHandler serves the rules API of docs/rules-api.md (PUT, GET,
// DELETE /v1/rules/{id}, GET /v1/rules, GET /v1/rules/history) against the
// node's lease group, authenticated by weir.LeaseConfig.AdminTokens or a
// verified client certificate. Serve it over TLS. It answers 503 on a node
// with no lease group or no tokens configured.
func RulesAdminHandler(n *weir.Node) http.Handler { return of(n).RulesAdminHandler() }

// adminReport is the JSON served by AdminHandler.
type adminReport struct {
	Status         weir.Status       `json:"status"`
	Counts         []weir.RuleCounts `json:"counts"`
	TopThrottled   []weir.Hitter     `json:"top_throttled"`
	TopShadow      []weir.Hitter     `json:"top_shadow_rejected"`
	KeyStoreCounts []weir.StoreStats `json:"stores"`
}

// AdminHandler serves, as JSON on GET, the node's rule status, the decision
// counts per rule, the top throttled identities, the top identities shadow
// rules would have rejected, and the key stores' sizes. It names
// identities: on a node with weir.LeaseConfig.AdminTokens it authenticates
// every request as RulesAdminHandler does (401 otherwise, logged and
// counted with the rules API's refusals); elsewhere mount it behind a
// raftgroup.Guard, or where only operators reach it (docs/security.md).
func AdminHandler(n *weir.Node) http.Handler {
	v := of(n)
	return v.Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeProblem(w, http.StatusMethodNotAllowed, "Method Not Allowed", "the admin report is read-only: use GET")
			return
		}
		writeJSON(w, adminReport{
			Status:         n.Status(),
			Counts:         v.Counts(),
			TopThrottled:   v.TopThrottled(),
			TopShadow:      v.TopShadowRejected(),
			KeyStoreCounts: v.StoreStats(),
		})
	}))
}

// IdentityHandler serves GET /v1/identities/{id} (the whole remaining
// path is the identity, URL-escaped; empty means the "" identity of global
// rules) as the JSON of LookupIdentity. Query parameters: method and path
// (keep only rules matching such a request), key (keep only rules keyed on that
// source: ip, user, header:NAME, and read that source's namespace; a top
// list's Hitter.Source), tier, raw ("true": the identity is the bucket key
// as weir.Node.CheckKeys charges it, see weir.IdentityQuery.Raw). Like
// AdminHandler it names identities, and like it it authenticates every
// request on a node with weir.LeaseConfig.AdminTokens (elsewhere: a
// raftgroup.Guard, or a place only operators reach). UIHandler serves the
// lookup too, authenticated the same way.
func IdentityHandler(n *weir.Node) http.Handler {
	v := of(n)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/identities/{id...}", identity(v))
	return v.Guard(mux)
}

// identity answers one identity lookup.
func identity(v view) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := weir.IdentityQuery{Method: r.URL.Query().Get("method"), Path: r.URL.Query().Get("path"),
			Key: r.URL.Query().Get("key"), Tier: r.URL.Query().Get("tier"), Raw: r.URL.Query().Get("raw") == "true"}
		if q.Method != "" && !validMethod(q.Method) {
			writeProblem(w, http.StatusBadRequest, "Bad Request", "method: not an HTTP method token")
			return
		}
		rep, err := v.LookupIdentity(r.Context(), r.PathValue("id"), q)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, "Bad Request", err.Error())
			return
		}
		writeJSON(w, rep)
	}
}

// validMethod reports whether m can be an HTTP method token.
func validMethod(m string) bool {
	if len(m) > 32 {
		return false
	}
	for i := range len(m) {
		if c := m[i]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z') {
			return false
		}
	}
	return true
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// writeProblem answers an RFC 9457 problem, as the rest of weir does.
func writeProblem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
	}{"about:blank", title, status, detail})
}

func noStore(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		h.ServeHTTP(w, r)
	})
}
