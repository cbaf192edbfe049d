package grpclimit_test

import (
	"os"
	"strings"
	"testing"

	"github.com/weir-dev/weir/quota"
)

// TestDocsRules: the rules in docs/grpc.md parse and validate.
func TestDocsRules(t *testing.T) {
	doc, err := os.ReadFile("../docs/grpc.md")
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(string(doc), "```yaml\n")
	if len(parts) != 2 {
		t.Fatalf("want one yaml block in docs/grpc.md, got %d", len(parts)-1)
	}
	block := parts[1][:strings.Index(parts[1], "```")]
	rules, err := quota.Parse("grpc.md", []byte(block))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := quota.NewSet(rules, 1); err != nil {
		t.Fatal(err)
	}
}
