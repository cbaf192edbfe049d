package weir

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/lease"
)

// answerReporter answers every report with one lease of its first item,
// and keeps the reports it got.
type answerReporter struct{ got []lease.Report }

func (a *answerReporter) Report(_ context.Context, r lease.Report) (lease.Result, error) {
	a.got = append(a.got, r)
	it := r.Items[0]
	return lease.Result{Grants: []lease.Grant{{Rule: it.Rule, Identity: it.Identity, Epoch: 3, Share: 10, Burst: 5,
		Lifetime: int64(2 * time.Second)}}}, nil
}

// TestLeaseAcceptedNamesItsReport: the "lease accepted" line of a lease a
// region's owner takes names the report it answers (reporter, sequence
// number), the send time, and when the region stops using it (send +
// lifetime − skew): what the voters' "lease granted" line of that report
// is matched by (TestPausedGlobalOwner, cmd/weir); the "lease report" line
// before it names the report and the demand of its item.
func TestLeaseAcceptedNamesItsReport(t *testing.T) {
	const skew = int64(500 * time.Millisecond)
	clock := int64(1_000_000_000_000)
	now := func() int64 { return clock }
	reg, err := lease.NewRegional(lease.RegionalConfig{Reporter: "eu-1", Region: "eu", Regions: 2,
		Skew: time.Duration(skew), Interval: 400 * time.Millisecond, FirstSeq: 41})
	if err != nil {
		t.Fatal(err)
	}
	rule := lease.Rule{ID: "world", Limit: 40, Window: time.Second, Burst: 10, MaxCost: 1}
	if err := reg.SetRules([]lease.RegionalRule{{Rule: rule, Fallback: lease.FallbackShare}}); err != nil {
		t.Fatal(err)
	}
	var tat bucket.TAT
	reg.Share(clock, "world", "k", &tat)
	reg.Observe(clock, "world", "k", 1, true, tat)
	var buf bytes.Buffer
	rep := &answerReporter{}
	gp := &globalPart{reg: reg, rep: rep, self: "eu-1", every: time.Second, timeout: time.Second, now: now, skew: skew,
		ring: func() *cluster.Ring { return nil }, ctx: context.Background(),
		log: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	n := &Node{global: gp, log: gp.log}
	clock += int64(time.Second)
	sent := clock
	if !n.reportOnce(false) || len(rep.got) != 1 {
		t.Fatalf("no report sent (%d reports)", len(rep.got))
	}
	type line struct {
		Msg, Region, Reporter, Rule, Identity string
		Seq, Epoch                            uint64
		Demand, Share, Sent, At, Until        int64
	}
	var lines []line
	for _, raw := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var l line
		if err := json.Unmarshal(raw, &l); err != nil {
			t.Fatalf("log %q: %v", buf.String(), err)
		}
		lines = append(lines, l)
	}
	r := rep.got[0]
	// First the report's item, then the lease it got.
	if len(lines) != 2 || lines[0].Msg != "lease report" || lines[0].Reporter != r.Reporter || lines[0].Seq != r.Seq ||
		lines[0].Identity != "k" || lines[0].Demand != r.Items[0].Demand || lines[0].Sent != sent {
		t.Fatalf("logged %+v for report %s seq %d sent at %d, want its item and then its lease", lines, r.Reporter, r.Seq, sent)
	}
	l := lines[1]
	if l.Msg != "lease accepted" || l.Reporter != r.Reporter || l.Seq != r.Seq || r.Seq != 42 || l.Region != "eu" ||
		l.Rule != "world" || l.Identity != "k" || l.Epoch != 3 || l.Share != 10 || l.Sent != sent || l.At != sent ||
		l.Until != sent+int64(2*time.Second)-skew {
		t.Fatalf("logged %+v for report %s seq %d sent at %d", l, r.Reporter, r.Seq, sent)
	}
}
