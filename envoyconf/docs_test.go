package envoyconf

import (
	"os"
	"strings"
	"testing"
)

// TestDocsDescriptorFile: the descriptor file in docs/envoy.md parses,
// compiles and matches as the doc says.
func TestDocsDescriptorFile(t *testing.T) {
	doc, err := os.ReadFile("../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	var block string
	for _, part := range strings.Split(string(doc), "```yaml\n")[1:] {
		if b := part[:strings.Index(part, "```")]; strings.HasPrefix(b, "domain:") {
			block = b
		}
	}
	if block == "" {
		t.Fatal("no descriptor file in docs/envoy.md")
	}
	d, err := Parse("envoy.md", []byte(block))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Compile(Options{}, d)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := c.Match("edge", []Entry{{"tenant", "trial-7"}}); !ok || m.Limit.RequestsPerUnit != 10 || m.Identity != "tenant=trial-7" {
		t.Errorf("tenant match %+v %v", m, ok)
	}
	if m, ok := c.Match("edge", []Entry{{"api_key", "partner-1"}}); !ok || !m.Limit.Unlimited {
		t.Errorf("partner match %+v %v", m, ok)
	}
}
