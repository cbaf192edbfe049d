// Package envoyconf imports envoyproxy/ratelimit's descriptor configuration
// (the YAML files its service loads: domain, nested descriptors, rate_limit,
// unlimited, shadow_mode, replaces, wildcard values) as weir rules, and
// matches the descriptors Envoy sends against it.
//
// It is pure: no sockets, no clock, no gRPC types (package rls adapts it to
// Envoy's RateLimitService). The usage loop:
//
//	d, err := envoyconf.LoadFile("config/ratelimit.yaml")   // one domain per file
//	cfg, err := envoyconf.Compile(envoyconf.Options{}, d)   // any number of domains
//	node, err := weir.New(weir.Config{Rules: cfg.Rules()})
//	m, ok := cfg.Match("edge", []envoyconf.Entry{{Key: "remote_address", Value: "10.0.0.1"}})
//	// ok: charge m.Limit.RuleID for identity m.Identity (unless m.Limit.Unlimited or Blocked)
//
// Every descriptor with a rate_limit becomes one quota.Rule. Its bucket is per
// distinct descriptor value path, as in envoyproxy/ratelimit: the identity is
// the request's entries joined as key=value (escaped). By default a limit of
// R per unit becomes a GCRA rule in shared mode with burst R (a client may
// send R at once, then one every unit/R); Options.Mode picks exact mode
// instead, and Options.FixedWindow keeps envoy's fixed windows (algorithm
// fixed_window, mode exact).
//
// Options.Fidelity counts as envoyproxy/ratelimit counts instead: one
// counter rule per unit (Config.CounterRule) to which every request adds
// its hits, compared with the descriptor's limit by package rls.
//
// detailed_metric and value_to_metric put a request's values into the
// limit's stats name, as in envoyproxy/ratelimit (Match.StatsKey; package
// rls bounds the number of such names). quota_mode is Limit.Quota.
package envoyconf
