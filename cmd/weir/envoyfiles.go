package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/weir-dev/weir/envoyconf"
	"github.com/weir-dev/weir/quota"
	"github.com/weir-dev/weir/rls"
)

// envoyFile is one descriptor file as read: its path (as named in errors)
// and its bytes, parsed from these bytes and no others.
type envoyFile struct {
	path, field string
	data        []byte
}

// envoyFiles are the descriptor files of one load, with a digest over
// their paths and contents that says whether anything changed.
type envoyFiles struct {
	files   []envoyFile
	skipped []string // entries of envoy.directory that are not descriptor files
	digest  [sha256.Size]byte
}

// isDescriptorFile reports whether an entry of envoy.directory named name
// is a descriptor file: a name ending in .yaml or .yml that does not start
// with a dot. Dot entries are skipped as envoyproxy/ratelimit skips them with
// RUNTIME_IGNOREDOTFILES: a Kubernetes ConfigMap volume holds each file
// twice, once under the "..data" symlink and its timestamped directory
// ("..2026_01_02_..."), and once as the top-level symlink into it.
func isDescriptorFile(name string) bool {
	return !strings.HasPrefix(name, ".") && (strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml"))
}

// readEnvoyFiles reads every descriptor file: envoy.descriptors, then the
// descriptor files of envoy.directory sorted by name. Symlinks are
// followed (a ConfigMap's files are symlinks). Errors name the config
// field and the file.
func (c *Config) readEnvoyFiles() (*envoyFiles, error) {
	e := c.Envoy
	out := &envoyFiles{}
	read := func(field, path string) error {
		if err := regularFile(path); err != nil {
			return c.errf(field, "%v", err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return c.errf(field, "%v", err)
		}
		out.files = append(out.files, envoyFile{path: path, field: field, data: data})
		return nil
	}
	for i, f := range e.Descriptors {
		if err := read(fmt.Sprintf("envoy.descriptors[%d]", i), f); err != nil {
			return nil, err
		}
	}
	if e.Directory != "" {
		ents, err := os.ReadDir(e.Directory)
		if err != nil {
			return nil, c.errf("envoy.directory", "%v", err)
		}
		names := make([]string, 0, len(ents))
		for _, ent := range ents {
			if strings.HasPrefix(ent.Name(), ".") {
				continue
			}
			if !isDescriptorFile(ent.Name()) {
				out.skipped = append(out.skipped, ent.Name())
				continue
			}
			names = append(names, ent.Name())
		}
		sort.Strings(names)
		for _, name := range names {
			path := filepath.Join(e.Directory, name)
			fi, err := os.Stat(path)
			if err != nil {
				return nil, c.errf("envoy.directory", "%v", err)
			}
			if fi.IsDir() { // subdirectories are not read
				out.skipped = append(out.skipped, name)
				continue
			}
			if err := read("envoy.directory", path); err != nil {
				return nil, err
			}
		}
	}
	h := sha256.New()
	for _, f := range out.files {
		fmt.Fprintf(h, "%d:%s\n%d:", len(f.path), f.path, len(f.data))
		h.Write(f.data)
	}
	h.Sum(out.digest[:0])
	return out, nil
}

// compileEnvoy parses and compiles read descriptor files. Every file's
// errors are reported, each naming the file, line and field.
func (c *Config) compileEnvoy(fs *envoyFiles) (*envoyconf.Config, error) {
	e := c.Envoy
	var domains []*envoyconf.Domain
	for _, f := range fs.files {
		d, err := envoyconf.Parse(f.path, f.data)
		if err != nil {
			return nil, c.errf(f.field, "%v", err)
		}
		domains = append(domains, d)
	}
	if len(domains) == 0 {
		return nil, c.errf("envoy.directory", "%s holds no descriptor file (*.yaml, *.yml)", e.Directory)
	}
	opts := envoyconf.Options{Mode: quota.Mode(e.Mode), OnFailure: quota.OnFailure(e.OnFailure), Accuracy: e.Accuracy,
		FixedWindow: e.FixedWindow, Fidelity: e.Fidelity, MergeDomains: e.MergeDomains}
	switch e.Mode {
	case "", "shared", "exact":
	default:
		return nil, c.errf("envoy.mode", "want shared or exact, got %q", e.Mode)
	}
	switch e.OnFailure {
	case "", "local", "open", "closed":
	default:
		return nil, c.errf("envoy.on_failure", "want local, open or closed, got %q", e.OnFailure)
	}
	if e.FixedWindow && e.Mode == "shared" {
		return nil, c.errf("envoy.fixed_window", "fixed windows are decided in exact mode: drop envoy.mode: shared, or fixed_window")
	}
	if e.Fidelity && e.Mode == "shared" {
		return nil, c.errf("envoy.fidelity", "fidelity's fixed windows are decided in exact mode: drop envoy.mode: shared, or fidelity")
	}
	if _, err := e.headerMode(); err != nil {
		return nil, c.errf("envoy.response_headers", "%v", err)
	}
	if e.Accuracy < 0 || e.Accuracy >= 1 {
		return nil, c.errf("envoy.accuracy", "want a fraction in [0, 1), got %v", e.Accuracy)
	}
	field := "envoy.descriptors"
	if len(e.Descriptors) == 0 {
		field = "envoy.directory"
	}
	cfg, err := envoyconf.Compile(opts, domains...)
	if err != nil {
		return nil, c.errf(field, "%v", err)
	}
	return cfg, nil
}

// envoyConfig loads and compiles the envoy descriptor files (nil when the
// config serves none).
func (c *Config) envoyConfig() (*envoyconf.Config, error) {
	if !c.servesEnvoy() {
		return nil, nil
	}
	fs, err := c.readEnvoyFiles()
	if err != nil {
		return nil, err
	}
	return c.compileEnvoy(fs)
}

// servesEnvoy reports whether the config names descriptor files.
func (c *Config) servesEnvoy() bool {
	return c.Envoy != nil && (len(c.Envoy.Descriptors) > 0 || c.Envoy.Directory != "")
}

// envoyWatchDirs are the directories whose changes may change the
// descriptor files: envoy.directory and the directory of each file of
// envoy.descriptors (watched, not the files, so that a replaced file or a
// re-pointed symlink is seen).
func (c *Config) envoyWatchDirs() []string {
	seen := map[string]bool{}
	var dirs []string
	add := func(d string) {
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	if c.Envoy.Directory != "" {
		add(c.Envoy.Directory)
	}
	for _, f := range c.Envoy.Descriptors {
		add(filepath.Dir(f))
	}
	return dirs
}

// headerMode is envoy.response_headers as an rls.HeaderMode.
func (e *EnvoySection) headerMode() (rls.HeaderMode, error) {
	switch e.ResponseHeaders {
	case "":
		if e.Fidelity {
			return rls.HeadersNone, nil
		}
		return rls.HeadersWeir, nil
	case "weir":
		return rls.HeadersWeir, nil
	case "none":
		return rls.HeadersNone, nil
	case "envoy":
		return rls.HeadersEnvoy, nil
	}
	return 0, fmt.Errorf("want weir, none or envoy, got %q", e.ResponseHeaders)
}

// rlsOptions are the rls.Service options of the envoy section (none for a
// nil section).
func (e *EnvoySection) rlsOptions() []rls.Option {
	if e == nil {
		return nil
	}
	hm, _ := e.headerMode() // validated by compileEnvoy
	opts := []rls.Option{rls.WithHeaders(hm), rls.WithGlobalShadow(e.ShadowMode),
		rls.WithEnvoyHeaderNames(e.HeaderNames.Limit, e.HeaderNames.Remaining, e.HeaderNames.Reset)}
	if e.ValueSeries != 0 {
		opts = append(opts, rls.WithValueSeries(e.ValueSeries))
	}
	return opts
}
