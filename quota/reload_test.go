package quota

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func rulesYAML(limit int) []byte {
	return fmt.Appendf(nil, "rules:\n  - id: r\n    limit: %d\n    window: 1s\n", limit)
}

// writeAtomic replaces a file by rename, as editors and deploy tools do, so
// the watcher never reads a half-written file (that would be reported as an
// error, and the test counts errors).
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// recorder collects callbacks from the watcher goroutine.
type recorder struct {
	mu      sync.Mutex
	changes []*Set
	errs    []error
}

func (r *recorder) onChange(s *Set) { r.mu.Lock(); r.changes = append(r.changes, s); r.mu.Unlock() }
func (r *recorder) onError(err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
}

func (r *recorder) errors() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func limitOf(h *Holder) int64 {
	s := h.Current()
	if s == nil || s.Len() == 0 {
		return 0
	}
	return s.Rule(0).Limit
}

// TestWatchConfigMapSwap performs the kubelet's atomic update: a new
// timestamped directory, a ..data_tmp symlink renamed over ..data.
func TestWatchConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(dir, "..2026_x"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "..2026_x", "rules.yaml"), rulesYAML(10), 0o644))
	must(os.Symlink("..2026_x", filepath.Join(dir, "..data")))
	must(os.Symlink("..data/rules.yaml", filepath.Join(dir, "rules.yaml")))

	var rec recorder
	// Polling off: the swap must be seen through fsnotify alone.
	w, err := WatchFile(context.Background(), filepath.Join(dir, "rules.yaml"),
		WatchOptions{Debounce: 20 * time.Millisecond, PollInterval: -1}, rec.onChange, rec.onError)
	must(err)
	defer w.Close()
	h := w.Holder()
	if limitOf(h) != 10 || h.Current().Version() != 1 {
		t.Fatalf("initial load: limit %d", limitOf(h))
	}

	must(os.Mkdir(filepath.Join(dir, "..2026_y"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "..2026_y", "rules.yaml"), rulesYAML(20), 0o644))
	must(os.Symlink("..2026_y", filepath.Join(dir, "..data_tmp")))
	must(os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	must(os.RemoveAll(filepath.Join(dir, "..2026_x")))

	waitFor(t, "the swapped rules", func() bool { return limitOf(h) == 20 })
	if v := h.Current().Version(); v != 2 {
		t.Errorf("version %d after one change, want 2", v)
	}
	rec.mu.Lock()
	n := len(rec.changes)
	rec.mu.Unlock()
	if n != 2 {
		t.Errorf("onChange called %d times, want 2 (initial load and swap)", n)
	}
	if errs := rec.errors(); len(errs) != 0 {
		t.Errorf("unexpected errors: %v", errs)
	}
	must(w.Close())
	must(w.Close()) // idempotent
}

func TestWatchInvalidKeepsOld(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, rulesYAML(10), 0o644); err != nil {
		t.Fatal(err)
	}
	var rec recorder
	holder := NewHolder(nil)
	w, err := WatchFile(context.Background(), path, WatchOptions{Holder: holder, Debounce: 10 * time.Millisecond, PollInterval: 50 * time.Millisecond},
		rec.onChange, rec.onError)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Holder() != holder || limitOf(holder) != 10 {
		t.Fatal("initial load not applied to the given holder")
	}
	old := holder.Current()

	bad := "rules:\n  - id: r\n    limit: 10\n    window: -1s\n"
	writeAtomic(t, path, []byte(bad))
	waitFor(t, "the error callback", func() bool { return len(rec.errors()) > 0 })
	msg := rec.errors()[0].Error()
	if !strings.Contains(msg, "rules.yaml:4: rules[0].window: must be positive") || !strings.Contains(msg, "keeping version 1") {
		t.Errorf("error does not name file, line and field: %s", msg)
	}
	if holder.Current() != old {
		t.Fatal("invalid file replaced the set")
	}
	// The same bad content is reported once, not on every poll.
	time.Sleep(150 * time.Millisecond) // three polls; bounded
	if n := len(rec.errors()); n != 1 {
		t.Errorf("bad file reported %d times", n)
	}

	writeAtomic(t, path, rulesYAML(30))
	waitFor(t, "the fixed rules", func() bool { return limitOf(holder) == 30 })
	if v := holder.Current().Version(); v != 2 {
		t.Errorf("version %d, want 2", v)
	}
}

func TestWatchPollOnly(t *testing.T) {
	// A file that reappears after being removed is picked up; the removal
	// is reported once and the old set stays.
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	os.WriteFile(path, rulesYAML(10), 0o644)
	var rec recorder
	ctx, cancel := context.WithCancel(context.Background())
	w, err := WatchFile(ctx, path, WatchOptions{Debounce: 10 * time.Millisecond, PollInterval: 20 * time.Millisecond}, rec.onChange, rec.onError)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	os.Remove(path)
	waitFor(t, "the read error", func() bool { return len(rec.errors()) > 0 })
	if limitOf(w.Holder()) != 10 {
		t.Fatal("removal dropped the set")
	}
	writeAtomic(t, path, rulesYAML(10)) // same content: no new version
	writeAtomic(t, path, rulesYAML(11))
	waitFor(t, "the new rules", func() bool { return limitOf(w.Holder()) == 11 })
	if n := len(rec.errors()); n != 1 {
		t.Errorf("%d errors, want 1: %v", n, rec.errors())
	}
	cancel() // ctx ends the loop; Close still works after.
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestWatchMissingDir(t *testing.T) {
	_, err := WatchFile(context.Background(), filepath.Join(t.TempDir(), "nope", "rules.yaml"), WatchOptions{}, nil, nil)
	if err == nil {
		t.Fatal("watching a missing directory succeeded")
	}
}
