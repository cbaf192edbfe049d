package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// svgElem is one element of a plot as checkSVG read it.
type svgElem struct {
	name  string
	attrs map[string]string
	text  string
}

// readSVG parses an SVG file as XML (it fails on a file that is not well
// formed) and returns its view box's size and its elements.
func readSVG(t *testing.T, path string) (float64, float64, []svgElem) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(data))
	var elems []svgElem
	var stack []int
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := svgElem{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			elems = append(elems, e)
			stack = append(stack, len(elems)-1)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 {
				elems[stack[len(stack)-1]].text += string(tok)
			}
		}
	}
	if len(elems) == 0 || elems[0].name != "svg" {
		t.Fatalf("%s: no svg element", path)
	}
	var vb [4]float64
	if _, err := fmt.Sscanf(elems[0].attrs["viewBox"], "%g %g %g %g", &vb[0], &vb[1], &vb[2], &vb[3]); err != nil || vb[0] != 0 || vb[1] != 0 {
		t.Fatalf("%s: viewBox %q", path, elems[0].attrs["viewBox"])
	}
	return vb[2], vb[3], elems
}

// checkInside fails the test for every element of elems positioned outside
// the w × h view box: coordinates, rectangles, polyline points and text,
// whose extent is estimated as the chart estimates it.
func checkInside(t *testing.T, w, h float64, elems []svgElem) {
	t.Helper()
	num := func(e svgElem, k string) float64 {
		v, err := strconv.ParseFloat(e.attrs[k], 64)
		if err != nil {
			t.Fatalf("<%s %s=%q>: %v", e.name, k, e.attrs[k], err)
		}
		return v
	}
	in := func(e svgElem, x, y float64) {
		if x < -0.01 || x > w+0.01 || y < -0.01 || y > h+0.01 {
			t.Errorf("<%s class=%q> %q: point (%.1f, %.1f) outside the %gx%g view box", e.name, e.attrs["class"], e.text, x, y, w, h)
		}
	}
	for _, e := range elems {
		switch e.name {
		case "line":
			in(e, num(e, "x1"), num(e, "y1"))
			in(e, num(e, "x2"), num(e, "y2"))
		case "rect":
			if e.attrs["width"] == "100%" {
				continue
			}
			x, y := num(e, "x"), num(e, "y")
			in(e, x, y)
			in(e, x+num(e, "width"), y+num(e, "height"))
		case "circle":
			in(e, num(e, "cx"), num(e, "cy"))
		case "polyline":
			for _, p := range strings.Fields(e.attrs["points"]) {
				var x, y float64
				if _, err := fmt.Sscanf(p, "%g,%g", &x, &y); err != nil {
					t.Fatalf("polyline point %q: %v", p, err)
				}
				in(e, x, y)
			}
		case "text":
			checkText(e, num(e, "x"), num(e, "y"), num(e, "font-size"), in)
		}
	}
}

// checkText checks a text's box: from its anchor, its estimated width and
// its font size; a text rotated by -90° about its anchor runs upwards.
func checkText(e svgElem, x, y, size float64, in func(svgElem, float64, float64)) {
	wd := estWidth(e.text, size)
	if e.attrs["font-weight"] == "bold" {
		wd *= boldWider
	}
	x0 := x
	switch e.attrs["text-anchor"] {
	case "middle":
		x0 = x - wd/2
	case "end":
		x0 = x - wd
	}
	if strings.HasPrefix(e.attrs["transform"], "rotate(-90") {
		in(e, x-size, y-(x0-x)) // the extent along x becomes one along -y
		in(e, x, y-(x0-x)-wd)
		return
	}
	in(e, x0, y-size)
	in(e, x0+wd, y+size*0.3)
}

// hasElem reports whether some element named name has a class containing
// class and text containing text.
func hasElem(elems []svgElem, name, class, text string) bool {
	for _, e := range elems {
		if e.name == name && strings.Contains(e.attrs["class"], class) && strings.Contains(e.text, text) {
			return true
		}
	}
	return false
}

// TestRatePlot: -plot writes a well-formed SVG with the title, the
// admitted, reference and bound series, a labelled mark for each crash and
// restart, a span for each partition and loss window, ring change ticks,
// and nothing outside the view box; and it does not change what the run
// prints.
func TestRatePlot(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, faults string
		want         [][3]string // element, class, text
	}{
		{"crash", "crash:n1@1s,restart:n1@2s", [][3]string{{"text", "mark-label", "crash n1"}, {"text", "mark-label", "restart n1"}}},
		{"partition", "partition:n0@1s-2s,loss:0.2@2500ms-3s,skew:n2:+50ms@500ms", [][3]string{
			{"rect", "partition", ""}, {"text", "span-label", "partition n0 | rest"},
			{"rect", "loss", ""}, {"text", "span-label", "loss 20%"}, {"text", "mark-label", "clock n2 +50ms"}}},
		{"none", "none", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"-quiet", "-nodes", "3", "-traffic", "uneven", "-duration", "4s", "-faults", tc.faults, "-seed", "3"}
			var plain, plotted, errs bytes.Buffer
			run(args, &plain, &errs)
			path := filepath.Join(dir, tc.name+".svg")
			if code := run(append(args, "-plot", path), &plotted, &errs); code != 0 {
				t.Fatalf("exit %d:\n%s%s", code, plotted.String(), errs.String())
			}
			if plain.String() != plotted.String() {
				t.Fatalf("-plot changed the output:\n%s\n---\n%s", plain.String(), plotted.String())
			}
			w, h, elems := readSVG(t, path)
			checkInside(t, w, h, elems)
			want := append([][3]string{{"text", "title", "Tokens admitted per second"}, {"polyline", "admitted", ""},
				{"polyline", "reference", ""}, {"polyline", "bound", ""}, {"text", "legend", "reference: one exact limiter"},
				{"text", "xlabel", "simulated time"}, {"text", "ylabel", "tokens admitted per second"}}, tc.want...)
			if tc.faults != "none" {
				want = append(want, [3]string{"line", "ring", ""}, [3]string{"rect", "tail", ""})
			}
			for _, wt := range want {
				if !hasElem(elems, wt[0], wt[1], wt[2]) {
					t.Errorf("no <%s class=%q> with text %q", wt[0], wt[1], wt[2])
				}
			}
		})
	}
}

// TestChartLongText: a long title wraps and long legend entries flow onto
// more rows, all inside the view box.
func TestChartLongText(t *testing.T) {
	long := strings.Repeat("WMW a very long title for a narrow picture ", 8)
	ch := &chart{title: []string{long}, subtitle: []string{long}, xLabel: "x", yLabel: "y", xMax: 123456, yMax: 98765432,
		marks: []chartMark{{x: 1, label: "crash n1"}, {x: 2, label: "restart n1"}, {x: 3, label: "crash n2"}, {x: 123456, label: "leave n9 at the very end"}},
		spans: []chartSpan{{from: 0, to: 5, fill: fillCut, label: "partition n0,n1,n2,n3 | rest", name: long[:90]}}}
	for i := range 6 {
		ch.lines = append(ch.lines, chartLine{name: fmt.Sprintf("series %d with a long name %s", i, long[:40]), class: "s", color: "#000", width: 1,
			pts: [][2]float64{{0, 0}, {123456, 98765432}}})
	}
	path := filepath.Join(t.TempDir(), "long.svg")
	if err := writePlot(path, ch.svg()); err != nil {
		t.Fatal(err)
	}
	w, h, elems := readSVG(t, path)
	checkInside(t, w, h, elems)
	titles := 0
	for _, e := range elems {
		if e.attrs["class"] == "title" {
			titles++
		}
	}
	if titles < 3 {
		t.Errorf("the long title took %d lines, want it wrapped", titles)
	}
}

// TestRatePlotOtherAlgorithm: a rule held to its reference instead of the
// envelope has no bound line, and its reference is named.
func TestRatePlotOtherAlgorithm(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fw.svg")
	var out, errs bytes.Buffer
	if code := run([]string{"-quiet", "-nodes", "3", "-algorithm", "fixed_window", "-duration", "3s", "-faults", "crash:n1@1s", "-plot", path}, &out, &errs); code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out.String(), errs.String())
	}
	w, h, elems := readSVG(t, path)
	checkInside(t, w, h, elems)
	if hasElem(elems, "polyline", "bound", "") {
		t.Error("a fixed_window run's plot has a bound line")
	}
	for _, wt := range [][3]string{{"text", "legend", "reference: one exact fixed_window"}, {"text", "subtitle", "one fixed_window fed them refuses"}, {"text", "mark-label", "crash n1"}} {
		if !hasElem(elems, wt[0], wt[1], wt[2]) {
			t.Errorf("no <%s class=%q> with text %q", wt[0], wt[1], wt[2])
		}
	}
}
