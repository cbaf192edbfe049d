package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// dirWatcher tells when the descriptor files may have changed: after any
// event in one of its directories has been followed by a quiet debounce,
// and every poll interval regardless (for file systems without
// notifications). It watches directories, not files, as the rules file's
// watcher does (quota.WatchFile), so that it sees a file replaced by a
// rename and the Kubernetes ConfigMap swap, where the "..data" symlink is
// re-pointed at a new timestamped directory. It does not read the files:
// the daemon does, and compares their digest with the one in force.
type dirWatcher struct {
	fsw     *fsnotify.Watcher
	changed chan struct{} // capacity 1: a pending signal stands for any number
	errs    chan error
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// watchDirs watches dirs. A zero debounce means 100ms, a zero poll 5s, a
// negative poll none.
func watchDirs(dirs []string, debounce, poll time.Duration) (*dirWatcher, error) {
	if debounce <= 0 {
		debounce = 100 * time.Millisecond
	}
	if poll == 0 {
		poll = 5 * time.Second
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching the descriptor files: %w", err)
	}
	for _, d := range dirs {
		if err := fsw.Add(d); err != nil {
			fsw.Close()
			return nil, fmt.Errorf("watching %s: %w", d, err)
		}
	}
	w := &dirWatcher{fsw: fsw, changed: make(chan struct{}, 1), errs: make(chan error, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	go w.loop(debounce, poll)
	return w, nil
}

// Changed receives when the files may have changed.
func (w *dirWatcher) Changed() <-chan struct{} { return w.changed }

// Errors receives the notification errors (the poll goes on).
func (w *dirWatcher) Errors() <-chan error { return w.errs }

// Close stops the watcher and waits for its goroutine. Safe to call twice.
func (w *dirWatcher) Close() {
	w.once.Do(func() {
		close(w.stop)
		<-w.done
		w.fsw.Close()
	})
}

func (w *dirWatcher) loop(debounce, poll time.Duration) {
	defer close(w.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var tick <-chan time.Time
	if poll > 0 {
		t := time.NewTicker(poll)
		defer t.Stop()
		tick = t.C
	}
	signal := func() {
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}
	for {
		select {
		case <-w.stop:
			return
		case _, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			timer.Reset(debounce)
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			select {
			case w.errs <- err:
			default:
			}
		case <-timer.C:
			signal()
		case <-tick:
			signal()
		}
	}
}
