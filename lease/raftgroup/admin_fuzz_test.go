package raftgroup

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzRulesAdminHTTP drives the rules API end to end (authentication,
// routing, the body decoder, the store) over a real one-voter group with
// hostile requests: method, path, query, token and body. No request may
// panic or answer 5xx but 503 (no leader); without the right token it is
// 401 and the rule version does not move.
func FuzzRulesAdminHTTP(f *testing.F) {
	c := newCluster(f, 1, nil)
	g := c.leader()
	a, err := AdminHandler(AdminConfig{Store: g, Tokens: map[string]string{aliceToken: "alice"}, Timeout: waitBound,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []struct {
		method    uint8
		path, qry string
		token     bool
		body      string
	}{
		{1, "/v1/rules/login", "", true, `{"limit": 5, "window": "1m"}`},
		{1, "/v1/rules/login", "", false, `{"limit": 5, "window": "1m"}`},
		{0, "/v1/rules", "consistent=true", true, ""},
		{0, "/v1/rules/history", "since=0&limit=5", true, ""},
		{0, "/v1/rules/history", "since=-1&limit=x", true, ""},
		{2, "/v1/rules/login", "", true, ""},
		{3, "/v1/rules/a/b", "", true, "{"},
		{1, "/v1/rules/\xff", "", true, `{"limit": 1, "window": "1s", "id": "other"}`},
		{1, "/v1/rules/x", "", true, `{"limit":5,"window":"1s","tiers":[{"name":"gold","limit":50}]}`},
	} {
		f.Add(s.method, s.path, s.qry, s.token, []byte(s.body))
	}
	methods := []string{http.MethodGet, http.MethodPut, http.MethodDelete, http.MethodPost, http.MethodHead, "BREW"}
	f.Fuzz(func(t *testing.T, method uint8, path, query string, token bool, body []byte) {
		if len(path) == 0 || path[0] != '/' {
			path = "/" + path
		}
		req := httptest.NewRequest(http.MethodGet, "/", bytes.NewReader(body))
		req.Method = methods[int(method)%len(methods)]
		req.URL.Path, req.URL.RawQuery = path, query
		req.Header.Set("Content-Type", "application/json")
		if token {
			req.Header.Set("Authorization", "Bearer "+aliceToken)
		} else if len(body) > 0 && body[0]&1 == 1 {
			req.Header.Set("Authorization", "Bearer "+string(body))
		}
		before, _ := g.Rules()
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, req)
		// 503 is the store's honest answer when the group has no leader
		// (an election on an overloaded machine); anything else 5xx is a bug.
		if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s %s?%s: %d %s", req.Method, path, query, rec.Code, rec.Body)
		}
		if !token && string(body) != aliceToken {
			if rec.Code != http.StatusUnauthorized {
				t.Fatalf("no valid token: %d", rec.Code)
			}
			if after, _ := g.Rules(); after != before {
				t.Fatalf("an unauthenticated request moved the rule version %d -> %d", before, after)
			}
		}
		if err := g.FSM().Check(); err != nil {
			t.Fatal(err)
		}
	})
}
