package quota_test

import (
	"fmt"

	"github.com/weir-dev/weir/quota"
)

func ExampleSet_Match() {
	rules, err := quota.Parse("rules.yaml", []byte(`
rules:
  - id: search
    match: {prefix: /search}
    key: [header:X-API-Key, ip]
    limit: 100
    window: 1m
    burst: 20
    cost_by_method: {POST: 5}
  - id: orders
    match: {pattern: "/v1/users/{id}/orders"}
    limit: 10
    window: 1s
  - id: everything
    limit: 50000
    window: 1s
    algorithm: fixed_window
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	s, err := quota.NewSet(rules, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	idx := make([]int, 0, 8)
	for _, req := range [][2]string{{"POST", "/search/q"}, {"GET", "/v1/users/7/orders"}, {"GET", "/searchx"}} {
		idx = s.Match(req[0], req[1], idx[:0])
		for _, i := range idx {
			r := s.Rule(i)
			fmt.Printf("%s %s: %s cost %d mode %s\n", req[0], req[1], r.ID, r.CostFor(req[0]), r.Mode)
		}
	}
	_, err = quota.Parse("rules.yaml", []byte("rules:\n  - id: a\n    limit: 10\n    window: 0s\n"))
	fmt.Println(err)
	// Output:
	// POST /search/q: search cost 5 mode shared
	// POST /search/q: everything cost 1 mode local
	// GET /v1/users/7/orders: orders cost 1 mode shared
	// GET /v1/users/7/orders: everything cost 1 mode local
	// GET /searchx: everything cost 1 mode local
	// rules.yaml:4: rules[0].window: must be positive, got 0s (rule "a")
}
