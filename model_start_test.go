package weir_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/quota"
)

// invalidRulesFile is a rules file whose first rule has a zero window on
// line 5: quota reports it as "rules.yaml:5: rules[0].window: ...".
const invalidRulesFile = `rules:
  - id: login
    key: [ip]
    limit: 5
    window: 0s
`

// TestInvalidRulesFileAtStart checks what a user sees when the rules file is
// unusable at start (docs/getting-started.md): with no DefaultRules, New
// fails with an error naming the file, the line and the field; with
// DefaultRules set the node starts on them and logs a warning naming the
// same, through Config.Logger or, when that is nil, slog.Default().
func TestInvalidRulesFileAtStart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte(invalidRulesFile), 0o600); err != nil {
		t.Fatal(err)
	}
	names := func(t *testing.T, what, s string) {
		t.Helper()
		for _, want := range []string{"rules.yaml:5", "rules[0].window"} {
			if !strings.Contains(s, want) {
				t.Errorf("%s does not name %q:\n%s", what, want, s)
			}
		}
	}

	t.Run("no defaults", func(t *testing.T) {
		n, err := weir.New(weir.Config{RulesFile: path, ReloadPoll: time.Hour})
		if err == nil {
			n.Close()
			t.Fatal("New with an invalid RulesFile and no DefaultRules returned no error")
		}
		names(t, "New's error", err.Error())
	})

	defaults := []quota.Rule{{ID: "fallback", Key: []quota.KeySource{{Kind: quota.KeyIP}}, Limit: 1, Window: time.Minute}}
	t.Run("defaults, Logger", func(t *testing.T) {
		var buf syncBuffer
		n, err := weir.New(weir.Config{RulesFile: path, DefaultRules: defaults, ReloadPoll: time.Hour,
			Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		if err != nil {
			t.Fatalf("New with DefaultRules: %v", err)
		}
		defer n.Close()
		if !n.Status().UsingDefaultRules {
			t.Error("Status().UsingDefaultRules is false")
		}
		names(t, "the log", buf.String())
	})

	t.Run("defaults, nil Logger", func(t *testing.T) {
		var buf syncBuffer
		prev := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
		defer slog.SetDefault(prev)
		n, err := weir.New(weir.Config{RulesFile: path, DefaultRules: defaults, ReloadPoll: time.Hour})
		if err != nil {
			t.Fatalf("New with DefaultRules: %v", err)
		}
		defer n.Close()
		names(t, "slog.Default()'s output", buf.String())
	})
}
