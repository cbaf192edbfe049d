package envoyoracle

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// scenario is one set of config files served by both, with envoyproxy's
// LIMIT_RESPONSE_HEADERS_ENABLED on or off. Files of one domain cannot be
// served together (neither service merges them with the pinned settings),
// so the corpus's test-domain files are scenarios of their own.
type scenario struct {
	name    string
	files   []string // relative to the envoyproxy/ratelimit module
	headers bool
}

var scenarios = []scenario{
	{"integration+examples", []string{
		"test/integration/runtime/current/ratelimit/config/basic.yaml",
		"test/integration/runtime/current/ratelimit/config/another.yaml",
		"test/integration/runtime/current/ratelimit/config/share_threshold.yaml",
		"test/integration/runtime/current/ratelimit/reload.yaml",
		"examples/ratelimit/config/config.yaml",
	}, false},
	{"basic_config", []string{"test/config/basic_config.yaml"}, true},
	{"wildcard", []string{"test/config/wildcard.yaml"}, false},
	{"shadowmode_config", []string{"test/config/shadowmode_config.yaml"}, false},
	{"example", []string{"examples/ratelimit/config/example.yaml"}, true},
}

// The boundary guard: no request is sent within guardBefore of a second
// boundary or guardAfter past it. envoyproxy/ratelimit reads the test's
// clock (set to the second the request is sent in); weir serve reads its
// own system clock somewhere between send and answer. A request whose answer
// arrives in a later window than it was sent in is excluded, and so is
// every later comparison of its descriptors in that window.
const (
	guardBefore = 40 * time.Millisecond
	guardAfter  = 3 * time.Millisecond
)

// knownMismatches are the mismatch classes the differential test finds
// today, each with its cause. The test fails when a class not listed
// appears, or when a listed class does not appear in a run of at least
// minRequestsForAbsence requests (then it is fixed: drop it).
var knownMismatches = map[string]string{}

const minRequestsForAbsence = 2000

// TestDifferential sends the same seeded random request streams to
// envoyproxy/ratelimit (on Redis, the test's clock) and to two `weir serve`
// processes (the default token buckets, and envoy.fixed_window: true), and
// compares every field of every answer.
func TestDifferential(t *testing.T) {
	total := 2000
	if os.Getenv("WEIR_ORACLE") == "long" {
		total = 10000
	}
	if v := os.Getenv("WEIR_ORACLE_REQUESTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("WEIR_ORACLE_REQUESTS=%q: want a positive count", v)
		}
		total = n
	}
	seed := int64(1)
	if v := os.Getenv("WEIR_ORACLE_SEED"); v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("WEIR_ORACLE_SEED=%q: %v", v, err)
		}
		seed = s
	}
	t.Logf("seed %d (WEIR_ORACLE_SEED=%d replays it), %d requests", seed, seed, total)
	defer func() {
		if t.Failed() {
			t.Logf("seed %d: replay with WEIR_ORACLE_SEED=%d WEIR_ORACLE_REQUESTS=%d", seed, seed, total)
		}
	}()

	root := envoyModuleDir(t)
	redis := startRedis(t)
	rng := rand.New(rand.NewSource(seed))
	tally := newTally()
	for i, sc := range scenarios {
		files := make([]string, len(sc.files))
		for j, f := range sc.files {
			files[j] = filepath.Join(root, f)
		}
		n := total / len(scenarios)
		if i < total%len(scenarios) {
			n++
		}
		t.Run(sc.name, func(t *testing.T) {
			if err := redis.command("FLUSHALL"); err != nil {
				t.Fatal(err)
			}
			domains, err := loadDomains(files)
			if err != nil {
				t.Fatal(err)
			}
			g := &generator{rng: rand.New(rand.NewSource(rng.Int63())), domains: domains}
			envoy := startEnvoy(t, redis.addr, files, sc.headers)
			weirs := []*weirServe{startWeir(t, files, weirDefault), startWeir(t, files, weirFixedWindow)}
			runStream(t, g, n, sc.headers, envoy, weirs, tally)
		})
	}
	tally.report(t, total)
	for class := range tally.classes {
		if _, known := knownMismatches[class]; !known {
			t.Errorf("new mismatch class %q (%d requests); first: %s", class, tally.classes[class], tally.first[class])
		}
	}
	if total >= minRequestsForAbsence {
		for class, cause := range knownMismatches {
			if tally.classes[class] == 0 {
				t.Errorf("known mismatch class %q (%s) did not occur in %d requests: drop it from knownMismatches", class, cause, total)
			}
		}
	}
}

// runStream sends n steps of the generator to envoy and the weirs.
func runStream(t *testing.T, g *generator, n int, headers bool, envoy *envoyService, weirs []*weirServe, tally *tally) {
	hist := newHistory()
	sent := 0
	for sent < n {
		if g.rng.Float64() < 0.002 {
			// A window edge: wait for the next second and send at once.
			now := time.Now()
			time.Sleep(now.Truncate(time.Second).Add(time.Second + guardAfter).Sub(now))
		}
		for _, req := range g.step() {
			if sent == n {
				break
			}
			sent++
			start := guardedNow()
			envoy.clock.now.Store(start.Unix())
			eResp, eErr, wResps, wErrs := ask(req, envoy, weirs)
			end := time.Now()
			for i, w := range weirs {
				tally.compare(t, string(w.mode), req, start, end, headers, eResp, eErr, wResps[i], wErrs[i], hist.view(string(w.mode)))
			}
			hist.record(req, start, end, eResp)
		}
	}
}

// guardedNow waits until the clock is outside the boundary guard and
// returns it.
func guardedNow() time.Time {
	for {
		now := time.Now()
		into := time.Duration(now.Nanosecond())
		switch {
		case into < guardAfter:
			time.Sleep(guardAfter - into)
		case into > time.Second-guardBefore:
			time.Sleep(time.Second - into + guardAfter)
		default:
			return now
		}
	}
}

// ask sends req to envoy and every weir at once.
func ask(req *pb.RateLimitRequest, envoy *envoyService, weirs []*weirServe) (*pb.RateLimitResponse, error, []*pb.RateLimitResponse, []error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wResps := make([]*pb.RateLimitResponse, len(weirs))
	wErrs := make([]error, len(weirs))
	for i, w := range weirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wResps[i], wErrs[i] = w.client.ShouldRateLimit(ctx, req)
		}()
	}
	eResp, eErr := envoy.client.ShouldRateLimit(ctx, req)
	wg.Wait()
	return eResp, eErr, wResps, wErrs
}

// history remembers, per descriptor and window, what envoyproxy/ratelimit
// answered before: which windows saw an OVER_LIMIT (envoyproxy counts those
// hits, weir does not) and which descriptors are excluded because an answer
// crossed a window boundary.
type history struct {
	overLimit map[string]bool // descKey|window
	excluded  map[string]bool // descKey|window
}

func newHistory() *history {
	return &history{overLimit: map[string]bool{}, excluded: map[string]bool{}}
}

func descKey(domain string, d *commonv3.RateLimitDescriptor) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range d.Entries {
		fmt.Fprintf(&b, "|%s=%s", e.Key, e.Value)
	}
	return b.String()
}

func unitSeconds(u pb.RateLimitResponse_RateLimit_Unit) int64 {
	switch u {
	case pb.RateLimitResponse_RateLimit_SECOND:
		return 1
	case pb.RateLimitResponse_RateLimit_MINUTE:
		return 60
	case pb.RateLimitResponse_RateLimit_HOUR:
		return 3600
	case pb.RateLimitResponse_RateLimit_DAY:
		return 86400
	case pb.RateLimitResponse_RateLimit_WEEK:
		return 7 * 86400
	case pb.RateLimitResponse_RateLimit_MONTH:
		return 30 * 86400
	case pb.RateLimitResponse_RateLimit_YEAR:
		return 365 * 86400
	}
	return 1
}

func windowKey(dk string, unit pb.RateLimitResponse_RateLimit_Unit, at time.Time) string {
	div := unitSeconds(unit)
	return fmt.Sprintf("%s|%d|%d", dk, div, at.Unix()/div)
}

func (h *history) record(req *pb.RateLimitRequest, start, end time.Time, eResp *pb.RateLimitResponse) {
	if eResp == nil {
		return
	}
	for i, st := range eResp.Statuses {
		if i >= len(req.Descriptors) || st.CurrentLimit == nil {
			continue
		}
		dk := descKey(req.Domain, req.Descriptors[i])
		if st.Code == pb.RateLimitResponse_OVER_LIMIT {
			h.overLimit[windowKey(dk, st.CurrentLimit.Unit, start)] = true
		}
		if a, b := windowKey(dk, st.CurrentLimit.Unit, start), windowKey(dk, st.CurrentLimit.Unit, end); a != b {
			h.excluded[a], h.excluded[b] = true, true
		}
	}
}

// historyView answers for one comparison.
type historyView struct {
	h *history
}

func (h *history) view(string) historyView { return historyView{h} }

func (v historyView) overLimitBefore(dk string, unit pb.RateLimitResponse_RateLimit_Unit, at time.Time) bool {
	return v.h.overLimit[windowKey(dk, unit, at)]
}

func (v historyView) excluded(dk string, unit pb.RateLimitResponse_RateLimit_Unit, at time.Time) bool {
	return v.h.excluded[windowKey(dk, unit, at)]
}

// tally counts mismatches by class, once per request and class.
type tally struct {
	requests map[string]int // per weir mode
	exact    map[string]int // requests answered the same in every field
	excluded map[string]int // requests not compared (a window boundary)
	classes  map[string]int
	first    map[string]string
}

func newTally() *tally {
	return &tally{requests: map[string]int{}, exact: map[string]int{}, excluded: map[string]int{},
		classes: map[string]int{}, first: map[string]string{}}
}

// resetSeconds is a duration until reset rounded as envoyproxy/ratelimit
// rounds it: whole seconds, up (it counts from the start of the current
// second).
func resetSeconds(d *durationpb.Duration) int64 {
	if d == nil {
		return -1
	}
	s := d.Seconds
	if d.Nanos > 0 {
		s++
	}
	return s
}

func (ta *tally) compare(t *testing.T, mode string, req *pb.RateLimitRequest, start, end time.Time, headers bool,
	e *pb.RateLimitResponse, eErr error, w *pb.RateLimitResponse, wErr error, hist historyView) {
	ta.requests[mode]++
	classes := map[string]bool{}
	add := func(cause string) { classes[mode+": "+cause] = true }
	switch {
	case eErr != nil || wErr != nil:
		if (eErr == nil) != (wErr == nil) {
			add("error on one side only")
		}
	case len(e.Statuses) != len(w.Statuses):
		add("status count")
	default:
		skip := false
		for i := range e.Statuses {
			es, ws := e.Statuses[i], w.Statuses[i]
			d := req.Descriptors[i]
			dk := descKey(req.Domain, d)
			if es.CurrentLimit != nil && hist.excluded(dk, es.CurrentLimit.Unit, start) {
				skip = true
				continue
			}
			for _, c := range statusCauses(mode, d, es, ws, hist, dk, start) {
				add(c)
			}
		}
		if skip {
			ta.excluded[mode]++
			return
		}
		if e.OverallCode != w.OverallCode && len(classes) == 0 {
			add("overall code with equal statuses")
		}
		if c := headerCause(headers, e, w); c != "" {
			add(c)
		}
	}
	if len(classes) == 0 {
		ta.exact[mode]++
		return
	}
	for c := range classes {
		ta.classes[c]++
		if _, ok := ta.first[c]; !ok {
			ta.first[c] = fmt.Sprintf("at %s request %v\n      envoy %v (err %v)\n      weir  %v (err %v)",
				start.Format("15:04:05.000"), req, e, eErr, w, wErr)
		}
	}
}

// statusCauses classifies the differences of one descriptor's status, by
// the first cause that explains them.
func statusCauses(mode string, d *commonv3.RateLimitDescriptor, es, ws *pb.RateLimitResponse_DescriptorStatus,
	hist historyView, dk string, at time.Time) []string {
	var fields []string
	if es.Code != ws.Code {
		fields = append(fields, "code")
	}
	if (es.CurrentLimit == nil) != (ws.CurrentLimit == nil) {
		fields = append(fields, "current_limit presence")
	} else if es.CurrentLimit != nil {
		if es.CurrentLimit.RequestsPerUnit != ws.CurrentLimit.RequestsPerUnit || es.CurrentLimit.Unit != ws.CurrentLimit.Unit {
			fields = append(fields, "current_limit")
		}
		if es.CurrentLimit.Name != ws.CurrentLimit.Name {
			fields = append(fields, "current_limit.name")
		}
	}
	if es.LimitRemaining != ws.LimitRemaining {
		fields = append(fields, "remaining")
	}
	if resetSeconds(es.DurationUntilReset) != resetSeconds(ws.DurationUntilReset) {
		fields = append(fields, "duration_until_reset")
	}
	if len(fields) == 0 {
		return nil
	}
	var out []string
	for _, f := range fields {
		switch {
		case d.Limit != nil:
			out = append(out, "limit override ignored: "+f)
		case f == "current_limit.name":
			out = append(out, "current_limit.name")
		case f == "current_limit presence":
			out = append(out, "current_limit presence")
		case mode == string(weirDefault):
			out = append(out, "token bucket: "+f)
		case es.CurrentLimit != nil && hist.overLimitBefore(dk, es.CurrentLimit.Unit, at):
			out = append(out, "rejected hits counted by envoy only: "+f)
		case f == "remaining" && es.Code == pb.RateLimitResponse_OVER_LIMIT && ws.Code == pb.RateLimitResponse_OVER_LIMIT:
			out = append(out, "OVER_LIMIT with remaining > 0")
		default:
			out = append(out, "unexplained: "+f)
		}
	}
	return out
}

// headerCause compares response_headers_to_add.
func headerCause(enabled bool, e, w *pb.RateLimitResponse) string {
	eh, wh := headerMap(e), headerMap(w)
	if !enabled {
		if len(eh) == 0 && len(wh) > 0 {
			return "headers added where envoy adds none"
		}
		if len(eh) != 0 || len(wh) != 0 {
			return "headers differ"
		}
		return ""
	}
	if fmt.Sprint(eh) == fmt.Sprint(wh) {
		return ""
	}
	if len(eh) > 0 && len(wh) > 0 {
		if _, ok := wh[strings.ToLower(pinnedSettings["LIMIT_LIMIT_HEADER"])]; !ok {
			return "headers: envoy's names (RateLimit-Limit/-Remaining/-Reset) missing"
		}
	}
	return "headers differ"
}

func headerMap(r *pb.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, h := range r.GetResponseHeadersToAdd() {
		m[strings.ToLower(h.Key)] = h.Value
	}
	return m
}

func (ta *tally) report(t *testing.T, total int) {
	modes := []string{string(weirDefault), string(weirFixedWindow)}
	for _, m := range modes {
		t.Logf("weir %s: %d requests, %d answered the same in every field, %d not compared (window boundary)",
			m, ta.requests[m], ta.exact[m], ta.excluded[m])
	}
	var classes []string
	for c := range ta.classes {
		classes = append(classes, c)
	}
	sort.Strings(classes)
	for _, c := range classes {
		t.Logf("  %6d  %s", ta.classes[c], c)
	}
	if testing.Verbose() {
		for _, c := range classes {
			t.Logf("first of %q: %s", c, ta.first[c])
		}
	}
}
