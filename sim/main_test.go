package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCommandDeterministic: the command prints the same bytes for one seed.
func TestCommandDeterministic(t *testing.T) {
	args := []string{"-quiet", "-nodes", "4", "-traffic", "uneven", "-faults", "crash:n2@1s,restart:n2@2s,loss:0.01", "-duration", "3s", "-seed", "9"}
	var a, b, errs bytes.Buffer
	if code := run(args, &a, &errs); code != 0 {
		t.Fatalf("exit %d: %s%s", code, a.String(), errs.String())
	}
	run(args, &b, &errs)
	if a.String() != b.String() {
		t.Fatalf("outputs differ:\n%s\n---\n%s", a.String(), b.String())
	}
	if !strings.Contains(a.String(), "reference") || !strings.Contains(a.String(), "within the envelope") {
		t.Fatalf("summary lacks the table:\n%s", a.String())
	}
}

// TestSameBytesAcrossProcesses: two processes print the same bytes for one
// seed. Each process seeds its own hashes (the coordinators' tables, as Go's
// maps are), so this catches a decision that depends on them, which one
// process run twice cannot: a run with a key cap far below its identities
// keeps the blind-spend sketches small and crowded, where such a
// dependence shows at once.
func TestSameBytesAcrossProcesses(t *testing.T) {
	if os.Getenv("WEIR_SIM_CHILD") != "" {
		t.Skip("a child process of this test runs the simulator instead")
	}
	var outs []string
	for range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSimChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "WEIR_SIM_CHILD=1")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		outs = append(outs, string(out))
	}
	if outs[0] != outs[1] {
		t.Fatalf("two processes printed different bytes for one seed:\n%s\n---\n%s", outs[0], outs[1])
	}
}

// TestSimChild is TestSameBytesAcrossProcesses's child: it prints one run.
func TestSimChild(t *testing.T) {
	if os.Getenv("WEIR_SIM_CHILD") == "" {
		t.Skip("runs only as a child of TestSameBytesAcrossProcesses")
	}
	var out, errs bytes.Buffer
	run([]string{"-quiet", "-nodes", "3", "-traffic", "saturate", "-ids", "400", "-keycap", "200", "-duration", "3s", "-seed", "1"}, &out, &errs)
	os.Stdout.WriteString("\n" + out.String() + errs.String() + "\n")
}

// TestFlagErrors: bad flags exit 2 with a message naming the problem.
func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-faults", "crash:n1"}, `-faults: fault spec: item 1 "crash:n1": missing "@TIME"`},
		{[]string{"-latency", "gauss:1ms"}, "-latency:"},
		{[]string{"-mode", "fuzzy"}, `mode "fuzzy"`},
		{[]string{"-traffic", "heavy"}, `traffic "heavy"`},
		{[]string{"-nodes", "0"}, "nodes 0"},
		{[]string{"-duration", "ten"}, "invalid value"},
		{[]string{"-sweep", "nodes=x"}, "-sweep: sweep spec"},
		{[]string{"-faults", "restart:n1@1s"}, "is running then"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-keycap", "-1"}, "keycap -1"},
		{[]string{"-rules", "limit"}, "-rules: rules spec"},
		{[]string{"-rules", "limit=10,tenants=5"}, "rule 2: tenants 5"},
	} {
		var out, errs bytes.Buffer
		code := run(append([]string{"-quiet"}, tc.args...), &out, &errs)
		if code != 2 || !strings.Contains(errs.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errs.String(), tc.want)
		}
	}
}

// TestSweepCommand: a small sweep passes and writes its plot: well-formed,
// titled, with the runs and the bound y = S, labelled axes, and nothing
// outside the view box.
func TestSweepCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errs bytes.Buffer
	code := run([]string{"-quiet", "-duration", "2s", "-out", dir, "-sweep", "nodes=3,4;traffic=uneven,saturate;faults=[none][crash:n1@500ms]"}, &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out.String(), errs.String())
	}
	if !strings.Contains(out.String(), "8 runs, 0 violations") {
		t.Fatalf("sweep output:\n%s", out.String())
	}
	w, h, elems := readSVG(t, filepath.Join(dir, "excess.svg"))
	checkInside(t, w, h, elems)
	for _, wt := range [][3]string{{"text", "title", "Worst excess over B + r·Δ"}, {"g", "runs", ""}, {"polyline", "bound", ""},
		{"text", "xlabel", "S = Σ sᵢ"}, {"text", "ylabel", "worst excess"}, {"text", "legend", "bound: excess = S"}} {
		if !hasElem(elems, wt[0], wt[1], wt[2]) {
			t.Errorf("excess.svg: no <%s class=%q> with text %q", wt[0], wt[1], wt[2])
		}
	}
}

// TestRulesFlag: -rules runs requests that carry several rules and prints
// each rule's figures.
func TestRulesFlag(t *testing.T) {
	var out, errs bytes.Buffer
	code := run([]string{"-quiet", "-nodes", "3", "-mode", "exact", "-ids", "4", "-rules", "limit=150,tenants=2", "-duration", "2s"}, &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out.String(), errs.String())
	}
	for _, want := range []string{"sim 100/1s burst 100 on id-i; sim2 150/1s burst 150 on tn-(i mod 2)", "refund term", "within the envelope"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("summary lacks %q:\n%s", want, out.String())
		}
	}
}

// TestKeyCapAndProfileFlags: -keycap reaches the run and its summary,
// and -cpuprofile writes a profile.
func TestKeyCapAndProfileFlags(t *testing.T) {
	prof := t.TempDir() + "/cpu.prof"
	var out, errs bytes.Buffer
	code := run([]string{"-quiet", "-nodes", "3", "-traffic", "zipf", "-ids", "500", "-rate", "5000", "-keycap", "50",
		"-duration", "2s", "-cpuprofile", prof}, &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out.String(), errs.String())
	}
	if !strings.Contains(out.String(), "key cap 50 per rule per node") {
		t.Fatalf("summary lacks the key cap:\n%s", out.String())
	}
	if fi, err := os.Stat(prof); err != nil || fi.Size() == 0 {
		t.Fatalf("no profile written: %v", err)
	}
}
