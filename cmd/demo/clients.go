package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// record is one request that reached a gateway's decision.
type record struct {
	at     int64 // send time, unix ns
	cost   int64 // tokens it costs under the rules (a POST costs 5)
	region int   // index of the region it was sent to
	ok     bool  // admitted
}

// client is one synthetic client: workers that each send a round of burst
// requests every `every`, under the client's identity, to the gateways of
// the region regionAt picks.
type client struct {
	name, about  string
	rule         string // the rule whose envelope it is checked against
	path         string
	key          string // X-API-Key, "" for none
	forwardedFor string // X-Forwarded-For, as a load balancer in front would write it
	customer     string // X-Customer
	every        time.Duration
	burst        int
	workers      int
	honour       bool // honours Retry-After, with jitter
	writes       bool // two requests in three are POSTs (cost 5)
	// regionAt returns the region of a request sent at fraction frac of
	// the run; nil means region 0.
	regionAt func(frac float64, rng *rand.Rand) int

	mu           sync.Mutex
	recs         []record
	count        atomic.Int64 // requests built, for the POST pattern
	sent         atomic.Int64
	admitted     atomic.Int64
	rejected     atomic.Int64
	other        atomic.Int64
	backoffs     atomic.Int64 // Retry-After waits honoured
	regionSent   [2]atomic.Int64
	sample429    atomic.Pointer[string]
	firstFailure atomic.Pointer[string]
}

// clients returns the demo's synthetic clients for the given number of
// regions. Offered load, all clients together: about 110 requests per
// second (see the -duration flag's help for what that costs).
func newClients(regions int) []*client {
	last := regions - 1 // the second region when there are two
	shift := func(frac float64, rng *rand.Rand) int {
		if regions == 1 {
			return 0
		}
		// 80 % of the partner's traffic in eu until 40 % of the run,
		// moving to 80 % in us by 60 %.
		p := 0.8
		switch {
		case frac >= 0.6:
			p = 0.2
		case frac > 0.4:
			p = 0.8 - 0.6*(frac-0.4)/0.2
		}
		if rng.Float64() < p {
			return 0
		}
		return 1
	}
	inLast := func(float64, *rand.Rand) int { return last }
	partner := "a global customer, 30 req/s over both regions; its traffic moves from eu (80 %) to us (80 %) between 40 % and 60 % of the run"
	if regions == 1 {
		partner = "a global customer, 30 req/s (one region: no shift)"
	}
	return []*client{
		{name: "steady", rule: "api-per-key", path: "/api/items", key: "key-steady", every: time.Second / 7, burst: 1, workers: 1, honour: true,
			about: "7 req/s, honours Retry-After with jitter (within 10/s; over the limit once it is tightened to 5/s)"},
		{name: "bursty", rule: "api-per-key", path: "/api/items", key: "key-bursty", every: 5 * time.Second, burst: 25, workers: 1,
			about: "25 at once every 5 s"},
		{name: "abusive", rule: "api-per-key", path: "/api/items", key: "key-abusive", every: 20 * time.Millisecond, burst: 1, workers: 1,
			about: "a hot key, 50 req/s, ignores 429s"},
		{name: "anon×4", rule: "api-per-key", path: "/api/items", forwardedFor: "198.51.100.7", every: time.Second / 4, burst: 1, workers: 4, regionAt: inLast,
			about: "4 anonymous clients behind one shared IP (X-Forwarded-For from a trusted proxy), 4 req/s each"},
		{name: "writer", rule: "api-per-key", path: "/api/items", key: "key-writer", every: time.Second / 3, burst: 1, workers: 1, writes: true, regionAt: inLast,
			about: "3 req/s, two in three are POSTs costing 5 tokens (cost_by_method)"},
		{name: "partner", rule: "partner-global", path: "/partner/orders", customer: "partner-1", every: time.Second / 30, burst: 1, workers: 1, regionAt: shift,
			about: partner},
	}
}

// drive sends the client's traffic from start until ctx ends.
func (c *client) drive(ctx context.Context, hc *http.Client, f *fleet, start time.Time, run time.Duration, seed uint64) {
	var wg sync.WaitGroup
	for w := range c.workers {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		// Workers start spread over one period, not in lockstep.
		offset := time.Duration(rng.Int64N(int64(c.every)))
		wg.Go(func() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(offset):
			}
			t := time.NewTicker(c.every)
			defer t.Stop()
			for {
				wait := c.round(ctx, hc, f, start, run, rng)
				if wait > 0 {
					// Honour Retry-After, plus up to half of it again as
					// jitter, so that clients told the same thing do not
					// come back together.
					c.backoffs.Add(1)
					wait += time.Duration(rng.Float64() * 0.5 * float64(wait))
					select {
					case <-ctx.Done():
						return
					case <-time.After(wait):
					}
					t.Reset(c.every)
					continue
				}
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		})
	}
	wg.Wait()
}

// round sends one round of requests and returns how long to back off (0
// unless the client honours Retry-After and was told to wait).
func (c *client) round(ctx context.Context, hc *http.Client, f *fleet, start time.Time, run time.Duration, rng *rand.Rand) time.Duration {
	region := 0
	if c.regionAt != nil {
		region = c.regionAt(float64(time.Since(start))/float64(run), rng)
	}
	var wait atomic.Int64
	var wg sync.WaitGroup
	for range c.burst {
		wg.Go(func() {
			if ra := c.send(ctx, hc, f, region); ra > 0 {
				wait.Store(int64(ra))
			}
		})
	}
	wg.Wait()
	if !c.honour {
		return 0
	}
	return time.Duration(wait.Load())
}

// send sends one request to a gateway of region and records the answer; it
// returns the Retry-After of a 429.
func (c *client) send(ctx context.Context, hc *http.Client, f *fleet, region int) time.Duration {
	method, cost := http.MethodGet, int64(1)
	if c.writes && c.count.Add(1)%3 != 0 {
		method, cost = http.MethodPost, 5
	}
	sent := time.Now().UnixNano()
	// A gateway taken out of rotation just after it was picked refuses
	// the connection; like a load balancer, try the next one (the request
	// never reached a decision there).
	var resp *http.Response
	var err error
	for range 3 {
		base := f.pick(f.regions[region])
		if base == "" {
			err = fmt.Errorf("no live gateway in region %s", f.regions[region])
			break
		}
		// The request outlives the run's context: one sent just before the
		// end is answered and counted, so admitted matches the upstream.
		req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), method, base+c.path, nil)
		if method == http.MethodPost {
			// Lets the transport send it again on a kept-alive connection
			// that a stopping gateway closed before reading it (as it does
			// for a GET); nothing reached the gateway then.
			req.Header.Set("Idempotency-Key", strconv.FormatInt(c.count.Load(), 10))
		}
		req.Header.Set(demoHeader, f.tag)
		if c.key != "" {
			req.Header.Set("X-API-Key", c.key)
		}
		if c.forwardedFor != "" {
			req.Header.Set("X-Forwarded-For", c.forwardedFor)
		}
		if c.customer != "" {
			req.Header.Set("X-Customer", c.customer)
		}
		if resp, err = hc.Do(req); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			// Only a refused connection is tried again elsewhere: any
			// other error (a timeout on a busy machine) may come after
			// the gateway decided and called the upstream, and sending
			// the request again would count it twice.
			break
		}

	}
	if err != nil {
		msg := err.Error()
		c.firstFailure.CompareAndSwap(nil, &msg)
		c.other.Add(1)
		return 0
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	rec := record{at: sent, cost: cost, region: region}
	var retry time.Duration
	switch resp.StatusCode {
	case http.StatusOK:
		rec.ok = true
		c.admitted.Add(1)
	case http.StatusTooManyRequests:
		c.rejected.Add(1)
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			retry = time.Duration(s) * time.Second
		}
		if c.sample429.Load() == nil {
			s := fmt.Sprintf("HTTP 429  Retry-After: %s  X-RateLimit-Remaining: %s  RateLimit: %s\n      %s",
				resp.Header.Get("Retry-After"), resp.Header.Get("X-RateLimit-Remaining"), resp.Header.Get("RateLimit"), bytes.TrimSpace(body))
			c.sample429.Store(&s)
		}
	default:
		msg := fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(body))
		c.firstFailure.CompareAndSwap(nil, &msg)
		c.other.Add(1)
		return 0
	}
	c.sent.Add(1)
	c.regionSent[region].Add(1)
	c.mu.Lock()
	c.recs = append(c.recs, rec)
	c.mu.Unlock()
	return retry
}

// records returns the client's records sorted by send time.
func (c *client) records() []record {
	c.mu.Lock()
	out := append([]record(nil), c.recs...)
	c.mu.Unlock()
	sortRecords(out)
	return out
}
