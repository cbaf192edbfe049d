package weircaddy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI is the admin.api.weir module: Caddy's admin endpoint serves
// GET /weir/ (the running nodes: id, rules status, cluster members) and
// GET /weir/{id} (the node's admin report, ops.AdminHandler: rule status,
// decision counts per rule, top throttled identities, key stores), behind
// the admin endpoint's own access controls.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.weir",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes returns the admin routes.
func (adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/weir/", Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// nodeSummary is one running node in GET /weir/.
type nodeSummary struct {
	ID      string      `json:"id"`
	Status  weir.Status `json:"status"`
	Members []string    `json:"members,omitempty"`
}

func serveAdmin(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use GET", r.Method)}
	}
	id := strings.TrimPrefix(r.URL.Path, "/weir/")
	if id != "" {
		n, ok := Node(id)
		if !ok {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no running weir node %q", id)}
		}
		ops.AdminHandler(n).ServeHTTP(w, r)
		return nil
	}
	nodes.mu.Lock()
	var list []nodeSummary
	for id, e := range nodes.m {
		if n := e.node.Load(); n != nil {
			list = append(list, nodeSummary{ID: id, Status: n.Status(), Members: ops.Members(n)})
		}
	}
	nodes.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].ID < list[j].ID })
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(list)
}

// Interface guards.
var _ caddy.AdminRouter = adminAPI{}
