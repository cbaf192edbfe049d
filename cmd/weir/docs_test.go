package main

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocsReferenceConfig checks that the complete example config of
// docs/weir.md parses and validates (with the files it names created).
func TestDocsReferenceConfig(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "weir.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "Every field, with its default.")
	if !ok {
		t.Fatal("docs/weir.md: the reference config's introduction is gone")
	}
	_, block, ok := strings.Cut(after, "```yaml\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("docs/weir.md: no yaml block after the reference config's introduction")
	}
	dir := t.TempDir()
	t.Chdir(dir)
	files := map[string]string{
		"gossip.key":     base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef")),
		"ratelimit.yaml": "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 600}\n",
		"tokens":         "alice:" + testToken + "\n",
	}
	for _, f := range []string{"peer.crt", "peer.key", "ca.crt", "lease.crt", "lease.key", "admin.crt", "admin.key"} {
		files[f] = "placeholder: validation checks that the file exists\n"
	}
	for name, body := range files {
		if err := os.WriteFile(name, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c, err := parseConfig("weir.md", []byte(block))
	if err != nil {
		t.Fatal(err)
	}
	c.applyDefaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if c.Node.Name != "gw-eu-1" || c.Gossip == nil || c.Envoy == nil || c.Lease == nil || c.Lease.Voter == nil || c.HTTP.TLS == nil {
		t.Fatalf("the reference config lost a section: %+v", c)
	}
}
