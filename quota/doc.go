// Package quota holds weir's rules as data: the Rule model, the YAML file
// format (docs/rules.md), validation, request matching, immutable versioned
// rule sets and their reload.
//
// Everything but the Watcher is pure: no clocks, goroutines or I/O beyond
// LoadFile's read. The node uses it like this:
//
//	set, err := quota.LoadOrDefault(path, defaults) // log err; set is never nil if defaults are valid
//	holder := quota.NewHolder(set)
//	w, err := quota.WatchFile(ctx, path, quota.WatchOptions{Holder: holder}, onChange, onError)
//	defer w.Close()
//
//	// per request, on any goroutine:
//	s := holder.Current()
//	idx = s.Match(r.Method, r.URL.Path, idx[:0])
//	for _, i := range idx {
//		rule := s.Rule(i)
//		cost := rule.CostFor(r.Method)
//		limit, burst := s.LimitsFor(i, identity, tier)
//		...
//	}
//
// A request handled under one set keeps using that *Set; a reload swaps the
// pointer whole, so a decision never mixes two versions. Rule indices are
// only meaningful within one Set.
//
// The package imports only the standard library, go.yaml.in/yaml/v3 and
// fsnotify; it never reaches cluster, lease, memberlist, raft or gRPC
// (TestImports enforces it).
package quota
