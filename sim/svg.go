package main

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// chart is one plot: lines and dots over an x and a y axis, with shaded
// spans and labelled vertical marks (faults), short ticks along the top
// (ring changes), a title above and the legend below the plot area. It is
// written as plain SVG with absolute coordinates, every element inside the
// view box: text widths are estimated on the wide side (estWidth), so a
// label fits whatever sans-serif font the viewer picks.
type chart struct {
	title, subtitle        []string // paragraphs; each is wrapped to the width
	xLabel, yLabel         string
	xMin, xMax, yMin, yMax float64
	spans                  []chartSpan
	marks                  []chartMark
	ticks                  []float64 // x of each short tick along the top
	tickName               string    // the ticks' legend entry
	lines                  []chartLine
	dots                   []chartDots
	notes                  []chartNote
}

// chartNote is a text inside the plot area, starting at data (x, y) and
// moved left as far as it must be to end inside the plot.
type chartNote struct {
	x, y float64
	text string
}

// chartLine is a series drawn as a polyline; lines are drawn in order,
// and listed in the legend by rank.
type chartLine struct {
	name, class, color, dash string
	width                    float64
	rank                     int
	pts                      [][2]float64
}

// chartDots is a series drawn as points.
type chartDots struct {
	name, class, color string
	pts                [][2]float64
}

// chartSpan shades [from, to] over the plot's height; a label names it
// above the plot, a name (once per distinct name) in the legend.
type chartSpan struct {
	from, to           float64
	fill, label, class string
	name               string
}

// chartMark is a dashed vertical line at x, labelled above the plot (the
// label is its legend).
type chartMark struct {
	x            float64
	label, color string
}

// The chart's fixed geometry, in SVG user units (pixels).
const (
	chartW      = 960.0
	plotH       = 320.0
	pad         = 14.0
	titleSize   = 17.0
	textSize    = 13.0
	smallSize   = 12.0
	lineGap     = 1.35 // line height as a multiple of the font size
	laneH       = 16.0 // one row of mark labels above the plot
	legendRowH  = 20.0
	swatchW     = 26.0
	boldWider   = 1.1
	fontFamilys = "DejaVu Sans, Verdana, Arial, Helvetica, sans-serif"
)

// estWidth is a generous estimate of s's width at font size size: wider
// than DejaVu Sans and Verdana (the widest common sans-serif faces) set it.
func estWidth(s string, size float64) float64 {
	w := 0.0
	for _, r := range s {
		switch {
		case strings.ContainsRune("iljtfr.,:;'|!()[] ", r):
			w += 0.42
		case strings.ContainsRune("mwMW@%—", r):
			w += 1.0
		case unicode.IsUpper(r) || unicode.IsDigit(r):
			w += 0.76
		default:
			w += 0.64
		}
	}
	return w * size
}

// wrap breaks s into lines no wider than width at font size size.
func wrap(s string, size, width float64) []string {
	var lines []string
	cur := ""
	for _, w := range strings.Fields(s) {
		try := w
		if cur != "" {
			try = cur + " " + w
		}
		if cur != "" && estWidth(try, size) > width {
			lines = append(lines, cur)
			try = w
		}
		cur = try
	}
	if cur != "" {
		lines = append(lines, cur)
	}
	return lines
}

// niceTicks returns about n round values (1, 2 or 5 times a power of ten)
// covering [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	if !(hi > lo) {
		hi = lo + 1
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if step = m * mag; step >= raw {
			break
		}
	}
	var out []float64
	for v := math.Ceil(lo/step-1e-9) * step; v <= hi+step*1e-9; v += step {
		out = append(out, math.Round(v/step)*step)
	}
	return out
}

// fmtNum writes a tick value without trailing zeros.
func fmtNum(v float64) string {
	if math.Abs(v) < 1e-9 {
		return "0"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// layout is where the parts of a chart go.
type layout struct {
	title, subtitle  []string
	left, top, right float64 // the plot area's edges
	bottom, height   float64 // its bottom edge; the whole picture's height
	lanes            []int   // the lane of each label (marks, then labelled spans)
	nLanes           int
	legend           []legendItem
	legendTop        float64
}

// legendItem is one entry of the legend and where it goes.
type legendItem struct {
	kind, name, color, dash, fill string
	width, x, y                   float64
}

func (c *chart) layout() layout {
	var l layout
	textW := chartW - 2*pad
	for _, p := range c.title {
		// Bold: a tenth wider than estWidth's regular face.
		l.title = append(l.title, wrap(p, titleSize*boldWider, textW)...)
	}
	for _, p := range c.subtitle {
		l.subtitle = append(l.subtitle, wrap(p, textSize, textW)...)
	}
	yTickW := 0.0
	for _, v := range niceTicks(c.yMin, c.yMax, 6) {
		yTickW = max(yTickW, estWidth(fmtNum(v), smallSize))
	}
	l.left = pad + textSize*lineGap + 6 + yTickW + 6
	lastX := niceTicks(c.xMin, c.xMax, 10)
	l.right = chartW - pad - estWidth(fmtNum(lastX[len(lastX)-1]), smallSize)/2
	l.lanes, l.nLanes = c.labelLanes(l.left, l.right)
	l.top = pad + float64(len(l.title))*titleSize*lineGap + float64(len(l.subtitle))*textSize*lineGap +
		float64(l.nLanes)*laneH + 8
	l.bottom = l.top + plotH
	l.legendTop = l.bottom + smallSize*lineGap + 4 + textSize*lineGap + 10
	l.legend = c.legendItems()
	x, y := l.left, l.legendTop
	for i := range l.legend {
		it := &l.legend[i]
		w := swatchW + 6 + estWidth(it.name, smallSize) + 18
		if x > l.left && x+w > chartW-pad {
			x, y = l.left, y+legendRowH
		}
		it.x, it.y = x, y
		x += w
	}
	l.height = y + legendRowH + pad
	if len(l.legend) == 0 {
		l.height = l.legendTop + pad
	}
	return l
}

// label is a text above the plot, centred on x.
type label struct {
	x    float64
	text string
}

// labels returns the marks' labels, then the labelled spans', in data x.
func (c *chart) labels() []label {
	var out []label
	for _, m := range c.marks {
		if m.label != "" {
			out = append(out, label{m.x, m.label})
		}
	}
	for _, s := range c.spans {
		if s.label != "" {
			out = append(out, label{(s.from + s.to) / 2, s.label})
		}
	}
	return out
}

// labelLanes gives each label the first lane above the plot where it does
// not overlap a label already there.
func (c *chart) labelLanes(left, right float64) ([]int, int) {
	var ends []float64 // per lane, the right edge of its last label
	lbs := c.labels()
	lanes := make([]int, len(lbs))
	order := make([]int, len(lbs))
	for i := range order {
		order[i] = i
	}
	// Left to right, so that each lane fills in order of x.
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && lbs[order[j]].x < lbs[order[j-1]].x; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	for _, i := range order {
		x0, x1 := labelExtent(lbs[i], c.xPix(lbs[i].x, left, right))
		lane := 0
		for lane < len(ends) && ends[lane] > x0-6 {
			lane++
		}
		if lane == len(ends) {
			ends = append(ends, 0)
		}
		ends[lane] = x1
		lanes[i] = lane
	}
	return lanes, len(ends)
}

// labelExtent is where a label centred on pixel x lies, kept inside the
// picture.
func labelExtent(lb label, x float64) (float64, float64) {
	w := estWidth(lb.text, smallSize)
	x0 := min(max(x-w/2, pad), chartW-pad-w)
	return x0, x0 + w
}

func (c *chart) xPix(x, left, right float64) float64 {
	if c.xMax <= c.xMin {
		return left
	}
	f := min(max((x-c.xMin)/(c.xMax-c.xMin), 0), 1)
	return left + f*(right-left)
}

func (c *chart) yPix(y, top, bottom float64) float64 {
	if c.yMax <= c.yMin {
		return bottom
	}
	f := min(max((y-c.yMin)/(c.yMax-c.yMin), 0), 1)
	return bottom - f*(bottom-top)
}

func (c *chart) legendItems() []legendItem {
	var out []legendItem
	lines := slices.Clone(c.lines)
	slices.SortStableFunc(lines, func(a, b chartLine) int { return a.rank - b.rank })
	for _, ln := range lines {
		out = append(out, legendItem{kind: "line", name: ln.name, color: ln.color, dash: ln.dash, width: ln.width})
	}
	for _, d := range c.dots {
		out = append(out, legendItem{kind: "dot", name: d.name, color: d.color})
	}
	seen := map[string]bool{}
	for _, s := range c.spans {
		if s.name != "" && !seen[s.name] {
			seen[s.name] = true
			out = append(out, legendItem{kind: "span", name: s.name, fill: s.fill})
		}
	}
	if len(c.ticks) > 0 {
		out = append(out, legendItem{kind: "tick", name: c.tickName, color: tickColor})
	}
	return out
}

const tickColor = "#4a6fa5"

// halo draws a white outline under a text's fill, so that a label stays
// readable where a mark's line or a span crosses it.
const halo = `stroke="#ffffff" stroke-width="3" stroke-linejoin="round" paint-order="stroke"`

// svg writes the chart.
func (c *chart) svg() []byte {
	l := c.layout()
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="%s">`+"\n",
		chartW, math.Ceil(l.height), chartW, math.Ceil(l.height), fontFamilys)
	fmt.Fprintf(&b, `<rect class="background" x="0" y="0" width="%.0f" height="%.0f" fill="#ffffff"/>`+"\n", chartW, math.Ceil(l.height))
	y := pad
	for _, t := range l.title {
		y += titleSize
		fmt.Fprintf(&b, `<text class="title" x="%.1f" y="%.1f" font-size="%.0f" font-weight="bold">%s</text>`+"\n", pad, y, titleSize, esc(t))
		y += titleSize * (lineGap - 1)
	}
	for _, t := range l.subtitle {
		y += textSize
		fmt.Fprintf(&b, `<text class="subtitle" x="%.1f" y="%.1f" font-size="%.0f" fill="#333333">%s</text>`+"\n", pad, y, textSize, esc(t))
		y += textSize * (lineGap - 1)
	}
	c.writeSpans(&b, l)
	c.writeAxes(&b, l)
	c.writeMarks(&b, l)
	c.writeSeries(&b, l)
	for _, n := range c.notes {
		w := estWidth(n.text, smallSize)
		x := max(min(c.xPix(n.x, l.left, l.right)+4, l.right-4-w), l.left+4)
		fmt.Fprintf(&b, `<text class="note" `+halo+` x="%.1f" y="%.1f" font-size="%.0f" fill="%s">%s</text>`+"\n",
			x, max(c.yPix(n.y, l.top, l.bottom), l.top+smallSize+12), smallSize, colBound, esc(n.text))
	}
	c.writeLegend(&b, l)
	b.WriteString("</svg>\n")
	return b.Bytes()
}

func (c *chart) writeSpans(b *bytes.Buffer, l layout) {
	for _, s := range c.spans {
		x0, x1 := c.xPix(s.from, l.left, l.right), c.xPix(s.to, l.left, l.right)
		if x1-x0 < 1 {
			x1 = x0 + 1
		}
		fmt.Fprintf(b, `<rect class="span %s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n",
			s.class, x0, l.top, x1-x0, l.bottom-l.top, s.fill)
	}
}

func (c *chart) writeAxes(b *bytes.Buffer, l layout) {
	for _, v := range niceTicks(c.yMin, c.yMax, 6) {
		y := c.yPix(v, l.top, l.bottom)
		fmt.Fprintf(b, `<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e3e3e3"/>`+"\n", l.left, y, l.right, y)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="%.0f" text-anchor="end">%s</text>`+"\n", l.left-6, y+4, smallSize, fmtNum(v))
	}
	for _, v := range niceTicks(c.xMin, c.xMax, 10) {
		x := c.xPix(v, l.left, l.right)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555555"/>`+"\n", x, l.bottom, x, l.bottom+5)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="%.0f" text-anchor="middle">%s</text>`+"\n", x, l.bottom+5+smallSize, smallSize, fmtNum(v))
	}
	fmt.Fprintf(b, `<rect class="frame" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#555555"/>`+"\n",
		l.left, l.top, l.right-l.left, l.bottom-l.top)
	xl := l.bottom + 5 + smallSize*lineGap + textSize
	fmt.Fprintf(b, `<text class="xlabel" x="%.1f" y="%.1f" font-size="%.0f" text-anchor="middle">%s</text>`+"\n",
		(l.left+l.right)/2, xl, textSize, esc(c.xLabel))
	yl := pad + textSize
	fmt.Fprintf(b, `<text class="ylabel" x="%.1f" y="%.1f" font-size="%.0f" text-anchor="middle" transform="rotate(-90 %.1f %.1f)">%s</text>`+"\n",
		yl, (l.top+l.bottom)/2, textSize, yl, (l.top+l.bottom)/2, esc(c.yLabel))
}

func (c *chart) writeMarks(b *bytes.Buffer, l layout) {
	lbs := c.labels()
	laneY := func(lane int) float64 { return l.top - 8 - float64(l.nLanes-1-lane)*laneH }
	// The lines first, each from its label down, then the labels over
	// them (a label may sit above another mark's line).
	k := 0
	for _, m := range c.marks {
		y0 := l.top
		if m.label != "" {
			y0 = laneY(l.lanes[k]) + 3
			k++
		}
		x := c.xPix(m.x, l.left, l.right)
		fmt.Fprintf(b, `<line class="mark" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1.5" stroke-dasharray="5 3"/>`+"\n",
			x, y0, x, l.bottom, m.color)
	}
	k = 0
	for _, m := range c.marks {
		if m.label == "" {
			continue
		}
		x0, _ := labelExtent(lbs[k], c.xPix(m.x, l.left, l.right))
		fmt.Fprintf(b, `<text class="mark-label" `+halo+` x="%.1f" y="%.1f" font-size="%.0f" fill="%s">%s</text>`+"\n",
			x0, laneY(l.lanes[k]), smallSize, m.color, esc(m.label))
		k++
	}
	for _, s := range c.spans {
		if s.label == "" {
			continue
		}
		x0, _ := labelExtent(lbs[k], c.xPix((s.from+s.to)/2, l.left, l.right))
		fmt.Fprintf(b, `<text class="span-label" `+halo+` x="%.1f" y="%.1f" font-size="%.0f" fill="#333333">%s</text>`+"\n",
			x0, laneY(l.lanes[k]), smallSize, esc(s.label))
		k++
	}
	for _, t := range c.ticks {
		x := c.xPix(t, l.left, l.right)
		fmt.Fprintf(b, `<line class="ring" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1.5"/>`+"\n",
			x, l.top, x, l.top+9, tickColor)
	}
}

func (c *chart) writeSeries(b *bytes.Buffer, l layout) {
	for _, ln := range c.lines {
		fmt.Fprintf(b, `<polyline class="series %s" fill="none" stroke="%s" stroke-width="%.1f" stroke-linejoin="round"`, ln.class, ln.color, ln.width)
		if ln.dash != "" {
			fmt.Fprintf(b, ` stroke-dasharray="%s"`, ln.dash)
		}
		b.WriteString(` points="`)
		for i, p := range ln.pts {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(b, "%.1f,%.1f", c.xPix(p[0], l.left, l.right), c.yPix(p[1], l.top, l.bottom))
		}
		b.WriteString("\"/>\n")
	}
	for _, d := range c.dots {
		fmt.Fprintf(b, `<g class="series %s" fill="%s" fill-opacity="0.7">`+"\n", d.class, d.color)
		for _, p := range d.pts {
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="4"/>`+"\n", c.xPix(p[0], l.left, l.right), c.yPix(p[1], l.top, l.bottom))
		}
		b.WriteString("</g>\n")
	}
}

func (c *chart) writeLegend(b *bytes.Buffer, l layout) {
	for _, it := range l.legend {
		y := it.y + legendRowH/2
		x := it.x
		switch it.kind {
		case "line":
			fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"`, x, y, x+swatchW, y, it.color, it.width)
			if it.dash != "" {
				fmt.Fprintf(b, ` stroke-dasharray="%s"`, it.dash)
			}
			b.WriteString("/>\n")
		case "dot":
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>`+"\n", x+swatchW/2, y, it.color)
		case "span":
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="12" fill="%s" stroke="#bbbbbb"/>`+"\n", x, y-6, swatchW, it.fill)
		case "tick":
			fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1.5"/>`+"\n",
				x+swatchW/2, y-6, x+swatchW/2, y+3, it.color)
		}
		fmt.Fprintf(b, `<text class="legend" x="%.1f" y="%.1f" font-size="%.0f">%s</text>`+"\n", x+swatchW+6, y+4, smallSize, esc(it.name))
	}
}

var escaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")

func esc(s string) string { return escaper.Replace(s) }
