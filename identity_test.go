package weir_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"unicode/utf8"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
)

// FuzzIdentityHandler: any identity and query parameters get a JSON answer,
// 200 with a report of that identity or 400 with a problem, never a panic.
func FuzzIdentityHandler(f *testing.F) {
	rules := []byte(uiRules)
	f.Add("key-1", "GET", "/api/x", "header:X-API-Key", "")
	f.Add("", "", "", "", "")
	f.Add("10.0.0.1", "POST", "/login", "ip", "gold")
	f.Add("a/b/../c", "g e t", "//api/../x", "user", "x")
	f.Fuzz(func(t *testing.T, id, method, path, key, tier string) {
		n, err := weir.New(weir.Config{Rules: parseRulesF(t, rules)})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		q := url.Values{}
		for k, v := range map[string]string{"method": method, "path": path, "key": key, "tier": tier} {
			if v != "" {
				q.Set(k, v)
			}
		}
		target := "/v1/identities/" + url.PathEscape(id) + "?" + q.Encode()
		r, err := http.NewRequest("GET", target, nil)
		if err != nil {
			return
		}
		rec := httptest.NewRecorder()
		ops.IdentityHandler(n).ServeHTTP(rec, r)
		switch rec.Code {
		case http.StatusOK:
			var rep weir.IdentityReport
			if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
				t.Fatalf("200 with a body that is not a report: %v", err)
			}
			// JSON carries text: an identity that is not valid UTF-8 is
			// reported with U+FFFD in place of its invalid bytes.
			if utf8.ValidString(id) && rep.Identity != id {
				t.Fatalf("report of %q for %q", rep.Identity, id)
			}
		case http.StatusBadRequest, http.StatusNotFound, http.StatusMovedPermanently, http.StatusTemporaryRedirect:
		default:
			t.Fatalf("status %d for %s", rec.Code, target)
		}
	})
}

func parseRulesF(t *testing.T, y []byte) []quota.Rule {
	t.Helper()
	return parseRules(t, string(y))
}
