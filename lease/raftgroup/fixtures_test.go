package raftgroup

import (
	"time"

	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/quota"
)

// The fixtures the group's tests share with the core's (lease's tests
// define the same values for the machine alone).

// testRule is the global rule of the lease tests.
var testRule = lease.Rule{ID: "global", Limit: 1000, Window: time.Minute, Burst: 100, MaxCost: 5}

// trialRule is a durable "one free trial per 30 days" rule.
var trialRule = lease.DurableRule{ID: "trial", Limit: 1, Window: 30 * 24 * time.Hour, Burst: 1}

// searchRule is a regional rule, globalRule a global one the machine
// leases.
var (
	searchRule = quota.Rule{ID: "search", Limit: 100, Window: time.Minute, Burst: 20,
		Key: []quota.KeySource{{Kind: quota.KeyHeader, Name: "X-Api-Key"}}, Match: quota.Match{Prefix: "/search"}}
	globalRule = quota.Rule{ID: "cust-global", Limit: 10000, Window: time.Minute, Burst: 600, Cost: 2,
		CostByMethod: map[string]int64{"POST": 5}, Scope: quota.ScopeGlobal}
)

// noopEntry is the no-op log entry, which the FSM applies as nothing.
var noopEntry = mustEncode(lease.Entry{})

func mustEncode(e lease.Entry) []byte {
	b, err := lease.EncodeLogEntry(e)
	if err != nil {
		panic(err)
	}
	return b
}

// fields returns the fields of the *quota.Error values in err.
func fields(err error) []string {
	var out []string
	for _, q := range lease.Problems(err) {
		out = append(out, q.Field)
	}
	return out
}
