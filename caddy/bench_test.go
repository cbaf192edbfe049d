package weircaddy_test

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weir-dev/weir/caddy"
	"github.com/weir-dev/weir/ops"
)

// The benchmark's Caddy: three servers with weir (one cluster), three
// without a limiter, and three without a limiter that send the headers of a
// weir answer as static headers, all in one config.
var (
	benchOnce    sync.Once
	benchWeir    []int
	benchPlain   []int
	benchHeaders []int
)

// startBench loads, once per process, three servers whose weir nodes form
// one cluster deciding a shared per-key rule, three servers that only
// respond, and three that respond with the five rate-limit headers a weir
// answer has: the same Caddy, the same handler after the limiter.
func startBench(b *testing.B) {
	benchOnce.Do(func() {
		ps := freePorts(b, 9)
		benchWeir, benchPlain, benchHeaders = ps[:3], ps[3:6], ps[6:]
		label := fmt.Sprintf("caddy-bench-%d", time.Now().UnixNano())
		// A limit no key reaches: the figure is the cost of deciding, not of
		// rejecting.
		rules := "\t\trules <<YAML\n\t\trules:\n\t\t  - id: shared-key\n\t\t    key: [header:X-API-Key]\n\t\t    limit: 1000000\n\t\t    window: 1s\n\t\t    burst: 1000000\n\t\t    mode: shared\n\t\tYAML"
		node := func(i int, join string) string {
			// LAN timings: a starved core must not look like a failed node.
			s := fmt.Sprintf("%s\n\t\tcluster {\n\t\t\tname b%d\n\t\t\tlabel %s\n", rules, i, label)
			if join != "" {
				s += "\t\t\tjoin " + join + "\n"
			}
			return s + "\t\t}"
		}
		conf := global
		for _, p := range benchPlain {
			conf += fmt.Sprintf("http://127.0.0.1:%d {\n\trespond ok\n}\n", p)
		}
		conf += site(benchWeir[0], "b0", node(0, ""), "ok")
		loadForever(b, conf)
		n0, _ := weircaddy.Node("b0")
		g := ops.GossipAddr(n0)
		for i := 1; i < 3; i++ {
			conf += site(benchWeir[i], fmt.Sprintf("b%d", i), node(i, g), "ok")
			loadForever(b, conf)
		}
		for i := range 3 {
			n, _ := weircaddy.Node(fmt.Sprintf("b%d", i))
			for deadline := time.Now().Add(10 * time.Second); len(ops.Members(n)) < 3; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					b.Fatalf("node b%d sees members %v", i, ops.Members(n))
				}
			}
		}
		a := get(b, benchWeir[0], "key-0")
		var hs string
		for _, k := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit-Policy", "Ratelimit"} {
			if a.header.Get(k) == "" {
				b.Fatalf("weir's answer has no %s header: %v", k, a.header)
			}
			hs += fmt.Sprintf("\theader %s `%s`\n", k, a.header.Get(k))
		}
		for _, p := range benchHeaders {
			conf += fmt.Sprintf("http://127.0.0.1:%d {\n%s\trespond ok\n}\n", p, hs)
		}
		loadForever(b, conf)
	})
}

// BenchmarkCaddy is requests/s through Caddy with weir (a shared rule over
// 1000 keys, decided by a 3-node cluster, requests spread over the three
// servers), through the same Caddy with no limiter, and with no limiter but
// weir's five rate-limit headers sent as static headers. Each op is one
// round: the three kinds of servers take roundRequests requests each, one
// after the other (in an order that alternates from round to round), from
// 16 client goroutines in the same process. It reports each kind's median
// req/s and CPU µs per request over the rounds, and the medians of the
// rounds' ratios: on a machine shared with other work the rounds' ratios
// vary far less than the rates.
//
//	go test -run '^$' -bench BenchmarkCaddy -benchtime 15x
func BenchmarkCaddy(b *testing.B) {
	startBench(b)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	kinds := []struct {
		name  string
		ports []int
	}{{"none", benchPlain}, {"headers", benchHeaders}, {"weir", benchWeir}}
	rate := make([][]float64, len(kinds))
	cpu := make([][]float64, len(kinds))
	var next, bad atomic.Int64
	run := func(ports []int) (reqs float64, cpuUs float64) {
		urls := make([]string, len(ports))
		for i, p := range ports {
			urls[i] = fmt.Sprintf("http://127.0.0.1:%d/", p)
		}
		var left atomic.Int64
		left.Store(roundRequests)
		var wg sync.WaitGroup
		cpu0, start := cpuTime(b), time.Now()
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for left.Add(-1) >= 0 {
					i := next.Add(1)
					req, _ := http.NewRequest("GET", urls[i%3], nil)
					req.Header.Set("X-API-Key", "key-"+strconv.FormatInt(i%1000, 10))
					resp, err := cl.Do(req)
					if err != nil {
						bad.Add(1)
						continue
					}
					if resp.StatusCode != http.StatusOK {
						bad.Add(1)
					}
					drain(resp)
				}
			}()
		}
		wg.Wait()
		// CPU time per request (server and client: this process) is the
		// figure a machine shared with other work still measures.
		return roundRequests / time.Since(start).Seconds(), float64((cpuTime(b) - cpu0).Microseconds()) / roundRequests
	}
	run(benchWeir) // warm the connections
	run(benchPlain)
	run(benchHeaders)
	b.ResetTimer()
	for i := range b.N {
		for j := range kinds {
			k := j
			if i%2 == 1 {
				k = len(kinds) - 1 - j
			}
			r, c := run(kinds[k].ports)
			rate[k] = append(rate[k], r)
			cpu[k] = append(cpu[k], c)
		}
	}
	b.StopTimer()
	ratio := func(xs, ys []float64) float64 {
		rs := make([]float64, len(xs))
		for i := range xs {
			rs[i] = xs[i] / ys[i]
		}
		return median(rs)
	}
	for k, kind := range kinds {
		b.ReportMetric(median(rate[k]), "req/s-"+kind.name)
		b.ReportMetric(median(cpu[k]), "cpu-µs/req-"+kind.name)
	}
	b.ReportMetric(ratio(rate[2], rate[0]), "weir/none-req/s")
	b.ReportMetric(ratio(cpu[0], cpu[2]), "none/weir-cpu")
	b.ReportMetric(ratio(rate[1], rate[0]), "headers/none-req/s")
	b.ReportMetric(ratio(rate[2], rate[1]), "weir/headers-req/s")
	b.ReportMetric(0, "ns/op")
	if bad.Load() > 0 {
		b.Errorf("%d requests failed or were not 200", bad.Load())
	}
}

// roundRequests is how many requests each kind of server takes in a round.
const roundRequests = 4000

// median is the median of xs.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cpuTime is the user and system CPU time this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func drain(resp *http.Response) {
	var buf [512]byte
	for {
		if _, err := resp.Body.Read(buf[:]); err != nil {
			break
		}
	}
	resp.Body.Close()
}
