package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/weir-dev/weir/lease/raftgroup"
)

// The load of the process fault harness (faults_test.go): RLS callers on
// every gateway and durable callers through a raftgroup.Client, every decision
// recorded.

// rlsRec is one Envoy decision through a gateway: call and return (ns since
// the start), the gateway's index, the key, and the outcome.
type rlsRec struct {
	Call, Return int64
	GW           uint8
	Key          uint16
	Out          uint8 // 0 OK, 1 OVER_LIMIT, 2 error
}

// load is the client side: RLS callers on every gateway, durable callers
// through a raftgroup.Client, and a slow rules PUT loop.
type load struct {
	mu                       sync.Mutex
	rls                      []rlsRec
	hot                      []hotRec
	durable                  []durableRec
	firstRLSErr, firstDurErr map[string]string
}

func (h *harness) runLoad(ctx context.Context, l *load) *sync.WaitGroup {
	var wg sync.WaitGroup
	conns := make([]rlsv3.RateLimitServiceClient, len(h.gws))
	for i, g := range h.gws {
		cc, err := grpc.NewClient(g.current().addrs.RLS, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			h.t.Fatal(err)
		}
		h.t.Cleanup(func() { cc.Close() })
		conns[i] = rlsv3.NewRateLimitServiceClient(cc)
	}
	h.runHot(ctx, l, conns, &wg)
	for i := range h.gws {
		wg.Go(func() {
			var recs []rlsRec
			defer func() { l.mu.Lock(); l.rls = append(l.rls, recs...); l.mu.Unlock() }()
			for n := 0; ctx.Err() == nil; n++ {
				key := uint16((n*7 + i*13) % 256)
				call := h.now()
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := shouldRateLimit(cctx, conns[i], fmt.Sprintf("k%d", key), 1)
				cancel()
				r := rlsRec{Call: call, Return: h.now(), GW: uint8(i), Key: key}
				switch {
				case err != nil:
					if ctx.Err() != nil {
						return // the run ended: not an answer
					}
					r.Out = 2
					l.mu.Lock()
					if _, ok := l.firstRLSErr[h.gws[i].name]; !ok {
						l.firstRLSErr[h.gws[i].name] = err.Error()
					}
					l.mu.Unlock()
				case resp.OverallCode != rlsv3.RateLimitResponse_OK:
					r.Out = 1
				}
				recs = append(recs, r)
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	var rpcs []string
	for _, v := range h.voters {
		rpcs = append(rpcs, v.current().addrs.LeaseRPC)
	}
	lc, err := raftgroup.NewClient(raftgroup.ClientConfig{Voters: rpcs, Name: "faults-load"})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { lc.Close() })
	var seq atomic.Uint32
	for w := range 3 {
		rng := rand.New(rand.NewPCG(uint64(w), 7))
		wg.Go(func() {
			var recs []durableRec
			defer func() { l.mu.Lock(); l.durable = append(l.durable, recs...); l.mu.Unlock() }()
			for ctx.Err() == nil {
				// About 6 decisions per identity, by the three callers at
				// once, asking for about 9 tokens of its 5.
				id := seq.Add(1) / 6
				cost := 1 + rng.IntN(2)
				call := h.now()
				cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				d, err := lc.Durable(cctx, durableRule, fmt.Sprintf("acct-%d", id), int64(cost))
				cancel()
				r := durableRec{Call: call, Return: h.now(), ID: id, Cost: uint8(cost)}
				switch {
				case err != nil:
					r.Out = outUnknown
					if ctx.Err() == nil {
						l.mu.Lock()
						if _, ok := l.firstDurErr["durable"]; !ok {
							l.firstDurErr["durable"] = err.Error()
						}
						l.mu.Unlock()
					}
				case d.Allowed:
					r.Out = outAdmitted
				default:
					r.Out = outRejected
				}
				recs = append(recs, r)
				time.Sleep(25 * time.Millisecond)
			}
		})
	}
	return &wg
}
