package weircaddy_test

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weir-dev/weir/caddy"
	"github.com/weir-dev/weir/ops"
)

// benchPorts are the ports of the benchmark's Caddy: three servers with
// weir (one cluster) and three without a limiter, in one config.
var (
	benchOnce  sync.Once
	benchWeir  []int
	benchPlain []int
)

// startBench loads, once per process, three servers whose weir nodes form
// one cluster deciding a shared per-key rule, and three servers that only
// respond: the same Caddy, the same handler after the limiter.
func startBench(b *testing.B) {
	benchOnce.Do(func() {
		ps := freePorts(b, 6)
		benchWeir, benchPlain = ps[:3], ps[3:]
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
	})
}

// BenchmarkCaddy is requests/s through Caddy with weir (a shared rule over
// 1000 keys, decided by a 3-node cluster, requests spread over the three
// servers) and through the same Caddy with no limiter. The client runs in
// the same process; run the two alternated and read the ratio of their req/s
// (on an idle machine) or of their cpu-µs/op (on a shared one):
//
//	go test -run '^$' -bench BenchmarkCaddy -benchtime 3s -count 5
func BenchmarkCaddy(b *testing.B) {
	startBench(b)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	for _, c := range []struct {
		name  string
		ports []int
	}{{"limiter=none", benchPlain}, {"limiter=weir", benchWeir}} {
		b.Run(c.name, func(b *testing.B) {
			var next, bad atomic.Int64
			urls := make([]string, len(c.ports))
			for i, p := range c.ports {
				urls[i] = fmt.Sprintf("http://127.0.0.1:%d/", p)
			}
			b.SetParallelism(8)
			cpu0 := cpuTime(b)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
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
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
			// CPU time per request (server and client: this process) is the
			// figure a machine shared with other work still measures: a
			// saturated dedicated core serves 1/cpu-µs requests per µs.
			b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			if bad.Load() > 0 {
				b.Errorf("%d of %d requests failed or were not 200", bad.Load(), b.N)
			}
		})
	}
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
