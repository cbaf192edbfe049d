package envoyconf

import (
	"os"
	"strings"
	"testing"
)

// TestDocsDescriptorFile: every descriptor file in docs/envoy.md parses and
// compiles, and the example of domain edge matches as the doc says.
func TestDocsDescriptorFile(t *testing.T) {
	doc, err := os.ReadFile("../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	var edge *Config
	for _, part := range strings.Split(string(doc), "```yaml\n")[1:] {
		block := part[:strings.Index(part, "```")]
		if !strings.HasPrefix(block, "domain:") {
			continue
		}
		d, err := Parse("envoy.md", []byte(block))
		if err != nil {
			t.Fatalf("a descriptor file in docs/envoy.md: %v", err)
		}
		c, err := Compile(Options{}, d)
		if err != nil {
			t.Fatalf("a descriptor file in docs/envoy.md: %v", err)
		}
		if strings.HasPrefix(block, "domain: edge\n") {
			edge = c
		}
	}
	if edge == nil {
		t.Fatal("no descriptor file of domain edge in docs/envoy.md")
	}
	if m, ok := edge.Match("edge", []Entry{{"tenant", "trial-7"}}); !ok || m.Limit.RequestsPerUnit != 10 || m.Identity != "tenant=trial-7" {
		t.Errorf("tenant match %+v %v", m, ok)
	}
	if m, ok := edge.Match("edge", []Entry{{"api_key", "partner-1"}}); !ok || !m.Limit.Unlimited {
		t.Errorf("partner match %+v %v", m, ok)
	}
}
