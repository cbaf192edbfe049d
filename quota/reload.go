package quota

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Holder holds the rule set in force and swaps it whole on a valid reload.
// Current is lock-free; Apply calls are serialised. The zero Holder holds
// no set (Current returns nil) and numbers its first set 1.
type Holder struct {
	cur atomic.Pointer[Set]
	mu  sync.Mutex // serialises Apply
}

// NewHolder returns a Holder holding s (which may be nil).
func NewHolder(s *Set) *Holder {
	h := &Holder{}
	if s != nil {
		h.cur.Store(s)
	}
	return h
}

// Current returns the set in force, or nil if none was ever applied.
func (h *Holder) Current() *Set { return h.cur.Load() }

// Apply validates rules and, if they are valid and differ from the current
// set (by Digest), swaps in a new set with the next version. It returns the
// set in force afterwards: the new set, or the current one unchanged when
// the rules are the same. On invalid rules the current set stays in force
// and Apply returns it with the validation error.
func (h *Holder) Apply(rules []Rule) (*Set, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cur := h.cur.Load()
	var next uint64 = 1
	if cur != nil {
		next = cur.Version() + 1
	}
	s, err := NewSet(rules, next)
	if err != nil {
		return cur, err
	}
	if cur != nil && cur.Digest() == s.Digest() {
		return cur, nil
	}
	h.cur.Store(s)
	return s, nil
}

// LoadOrDefault loads the rules file at path into a set with version 1.
// When the file is unreadable or invalid it returns a set of defaults
// instead, together with an error that says so and why; the node logs it
// and enforces the defaults. If the defaults are invalid too it returns nil
// and both errors.
func LoadOrDefault(path string, defaults []Rule) (*Set, error) {
	rules, err := LoadFile(path)
	if err == nil {
		var s *Set
		if s, err = NewSet(rules, 1); err == nil {
			return s, nil
		}
	}
	s, derr := NewSet(defaults, 1)
	if derr != nil {
		return nil, errors.Join(fmt.Errorf("quota: rules file %s unusable: %w", path, err), fmt.Errorf("quota: default rules invalid: %w", derr))
	}
	return s, fmt.Errorf("quota: rules file %s unusable, enforcing %d default rules: %w", path, len(defaults), err)
}

// WatchOptions configures WatchFile. The zero value works.
type WatchOptions struct {
	// Holder receives the reloaded sets. Nil means a new, empty Holder,
	// available from Watcher.Holder.
	Holder *Holder
	// Debounce is how long the file's directory must be quiet after an
	// event before the file is read again. Zero means 100ms.
	Debounce time.Duration
	// PollInterval is how often the file is read regardless of events, as a
	// fallback for file systems without notifications. Zero means 5s; a
	// negative value disables polling.
	PollInterval time.Duration
}

// Watcher reloads a rules file into a Holder when it changes.
type Watcher struct {
	path     string
	holder   *Holder
	fs       *fsnotify.Watcher
	opts     WatchOptions
	onChange func(*Set)
	onError  func(error)

	lastSum  [sha256.Size]byte
	haveSum  bool
	lastRead string // last read error reported, to report each once
	cancel   context.CancelFunc
	done     chan struct{}
	closeErr error
	once     sync.Once
}

// WatchFile watches the rules file at path and applies every valid change
// to opts.Holder. It watches the file's directory, not the file, so that it
// survives editors that replace the file and the Kubernetes ConfigMap swap
// (a "..data" symlink re-pointed atomically), and it also polls every
// opts.PollInterval. Content is compared by digest, so an unchanged file is
// not re-applied and a bad file is reported once per distinct content.
//
// The file is read once before WatchFile returns. onChange is called with
// the new set after each swap; onError with every failure (an unreadable
// or invalid file, with file, line and field; a watch error), after which
// the last good set stays in force. Either callback may be nil. Callbacks
// run on the watcher's goroutine (or the caller's, for the first read), one
// at a time. The watcher stops when ctx ends or Close is called.
func WatchFile(ctx context.Context, path string, opts WatchOptions, onChange func(*Set), onError func(error)) (*Watcher, error) {
	if opts.Holder == nil {
		opts.Holder = &Holder{}
	}
	if opts.Debounce <= 0 {
		opts.Debounce = 100 * time.Millisecond
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 5 * time.Second
	}
	if onChange == nil {
		onChange = func(*Set) {}
	}
	if onError == nil {
		onError = func(error) {}
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("quota: watching %s: %w", path, err)
	}
	if err := fsw.Add(filepath.Dir(path)); err != nil {
		fsw.Close()
		return nil, fmt.Errorf("quota: watching %s: %w", path, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &Watcher{path: path, holder: opts.Holder, fs: fsw, opts: opts, onChange: onChange, onError: onError,
		cancel: cancel, done: make(chan struct{})}
	w.reload()
	go w.loop(ctx)
	return w, nil
}

// Holder returns the Holder the watcher applies changes to.
func (w *Watcher) Holder() *Holder { return w.holder }

// Close stops the watcher and waits for its goroutine to end. It is safe to
// call more than once; callbacks are not called after it returns.
func (w *Watcher) Close() error {
	w.once.Do(func() {
		w.cancel()
		<-w.done
		w.closeErr = w.fs.Close()
	})
	return w.closeErr
}

func (w *Watcher) loop(ctx context.Context) {
	defer close(w.done)
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	var poll <-chan time.Time
	if w.opts.PollInterval > 0 {
		t := time.NewTicker(w.opts.PollInterval)
		defer t.Stop()
		poll = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-w.fs.Events:
			if !ok {
				return
			}
			// Any event in the directory may be the swap we wait for
			// ("..data" renamed, the file replaced); reading is cheap.
			debounce.Reset(w.opts.Debounce)
		case err, ok := <-w.fs.Errors:
			if !ok {
				return
			}
			w.onError(fmt.Errorf("quota: watching %s: %w", w.path, err))
		case <-debounce.C:
			w.reload()
		case <-poll:
			w.reload()
		}
	}
}

// reload reads the file and applies it if its content changed.
func (w *Watcher) reload() {
	data, err := os.ReadFile(w.path)
	if err != nil {
		w.haveSum = false // apply again once it reappears, even unchanged
		if err.Error() != w.lastRead {
			w.lastRead = err.Error()
			w.onError(fmt.Errorf("quota: reading rules: %w", err))
		}
		return
	}
	w.lastRead = ""
	sum := sha256.Sum256(data)
	if w.haveSum && bytes.Equal(sum[:], w.lastSum[:]) {
		return
	}
	w.lastSum, w.haveSum = sum, true
	rules, err := Parse(filepath.Base(w.path), data)
	if err != nil {
		w.onError(fmt.Errorf("quota: rules file %s rejected, keeping version %d: %w", w.path, versionOf(w.holder.Current()), err))
		return
	}
	before := w.holder.Current()
	s, err := w.holder.Apply(rules)
	if err != nil {
		w.onError(fmt.Errorf("quota: rules file %s rejected: %w", w.path, err))
		return
	}
	if s != before {
		w.onChange(s)
	}
}

func versionOf(s *Set) uint64 {
	if s == nil {
		return 0
	}
	return s.Version()
}

// ApplyVersion installs rules as the set of the given version, when that is
// newer than the set in force: how a node takes a version decided elsewhere
// (the lease group's rule store), keeping its number. An older or equal
// version changes nothing and returns the set in force; invalid rules
// return it with the validation error.
func (h *Holder) ApplyVersion(rules []Rule, version uint64) (*Set, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cur := h.cur.Load()
	if cur != nil && version <= cur.Version() {
		return cur, nil
	}
	s, err := NewSet(rules, version)
	if err != nil {
		return cur, err
	}
	h.cur.Store(s)
	return s, nil
}

// Replace installs rules as version even when the set in force has a newer
// one: for a source of rules that went back (a lease group that lost
// acknowledged changes), whose versions the holder must follow again.
// Nothing is installed when the rules do not validate.
func (h *Holder) Replace(rules []Rule, version uint64) (*Set, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, err := NewSet(rules, version)
	if err != nil {
		return h.cur.Load(), err
	}
	h.cur.Store(s)
	return s, nil
}
