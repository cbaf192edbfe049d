package weir_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/quota"
)

// BenchmarkSetRules is the cost of a rule change with live keys in the
// store: SetRules must not touch them (they are converted on their next
// decision), so it costs the same with none as with millions:
//
//	go test -run '^$' -bench 'SetRules' -benchmem .
func BenchmarkSetRules(b *testing.B) {
	for _, keys := range []int{0, 1_000_000, 10_000_000} {
		b.Run("keys="+strconv.Itoa(keys/1000)+"k", func(b *testing.B) {
			if keys > 1_000_000 && testing.Short() {
				b.Skip("-short")
			}
			rules := func(limit int64) []quota.Rule {
				return []quota.Rule{{ID: "per-key", Match: quota.Match{Prefix: "/api"}, Key: []quota.KeySource{{Kind: quota.KeyUser}},
					Limit: limit, Window: time.Hour, Burst: 1_000_000}}
			}
			n, err := weir.New(weir.Config{Rules: rules(100), MaxKeys: max(keys, 1)})
			if err != nil {
				b.Fatal(err)
			}
			defer n.Close()
			ctx := context.Background()
			buf := []byte("user-")
			for i := range keys {
				if _, err := n.Check(ctx, string(strconv.AppendInt(buf[:5], int64(i), 10)), "per-key", 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if err := n.SetRules(rules(100 + int64(i%2))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
