package bench

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// Series is one line of a Chart.
type Series struct {
	Name   string
	X, Y   []float64
	Color  string // CSS color; "" picks from the palette
	Dashed bool
}

// Chart is a line chart drawn as a standalone SVG: axes with round ticks,
// one polyline with markers per series, and a legend. It is all the
// plotting the benchmarks need, without a plotting dependency.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
	// YFromZero starts the y axis at 0 (latency plots read better so).
	YFromZero bool
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

const (
	svgW, svgH                   = 760, 440
	padL, padR, padT, padB       = 70, 230, 40, 55
	plotW, plotH                 = svgW - padL - padR, svgH - padT - padB
	tickCount                    = 5
	legendX, legendY, legendStep = svgW - padR + 16, padT + 8, 18
)

// SVG renders the chart.
func (c Chart) SVG() []byte {
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for i := range s.X {
			if i >= len(s.Y) || !finite(s.X[i]) || !finite(s.Y[i]) {
				continue
			}
			xmin, xmax = math.Min(xmin, s.X[i]), math.Max(xmax, s.X[i])
			ymin, ymax = math.Min(ymin, s.Y[i]), math.Max(ymax, s.Y[i])
		}
	}
	if xmin > xmax { // no points
		xmin, xmax, ymin, ymax = 0, 1, 0, 1
	}
	if c.YFromZero {
		ymin = math.Min(0, ymin)
	}
	xt, yt := ticks(xmin, xmax), ticks(ymin, ymax)
	xmin, xmax = math.Min(xmin, xt[0]), math.Max(xmax, xt[len(xt)-1])
	ymin, ymax = math.Min(ymin, yt[0]), math.Max(ymax, yt[len(yt)-1])
	px := func(x float64) float64 { return padL + (x-xmin)/span(xmin, xmax)*plotW }
	py := func(y float64) float64 { return padT + plotH - (y-ymin)/span(ymin, ymax)*plotH }

	var b strings.Builder
	svgHead(&b, svgH, c.Title)
	for _, t := range yt {
		y := py(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e0e0e0"/>`+"\n", padL, y, padL+plotW, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, y+4, num(t))
	}
	for _, t := range xt {
		x := px(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e0e0e0"/>`+"\n", x, padT, x, padT+plotH)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, padT+plotH+16, num(t))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", padL, padT, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", padL+plotW/2, svgH-12, esc(c.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", padT+plotH/2, esc(c.YLabel))
	for i, s := range c.Series {
		color := s.Color
		if color == "" {
			color = palette[i%len(palette)]
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for j := range s.X {
			if j < len(s.Y) && finite(s.X[j]) && finite(s.Y[j]) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.X[j]), py(s.Y[j])))
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dash, strings.Join(pts, " "))
		for _, p := range pts {
			xy := strings.Split(p, ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], color)
		}
		ly := legendY + i*legendStep
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", legendX, ly, legendX+24, ly, color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", legendX+30, ly+4, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// svgHead opens a chart's SVG document: svgW wide and height high, on
// white, with its title.
func svgHead(b *strings.Builder, height int, title string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", svgW, height, svgW, height)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="white"/>`+"\n", svgW, height)
	fmt.Fprintf(b, `<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", padL, esc(title))
}

// ticks returns about tickCount round values covering [lo, hi].
func ticks(lo, hi float64) []float64 {
	if hi <= lo {
		hi = lo + 1
	}
	raw := (hi - lo) / tickCount
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var ts []float64
	for v := math.Floor(lo/step) * step; v <= hi+step*1e-9; v += step {
		ts = append(ts, v)
	}
	if ts[len(ts)-1] < hi {
		ts = append(ts, ts[len(ts)-1]+step)
	}
	return ts
}

func span(lo, hi float64) float64 {
	if hi > lo {
		return hi - lo
	}
	return 1
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func num(v float64) string {
	if math.Abs(v) < 1e-9 {
		return "0"
	}
	return fmt.Sprintf("%g", math.Round(v*1e6)/1e6)
}

func esc(s string) string { return html.EscapeString(s) }

// Bar is one bar of a BarChart.
type Bar struct {
	Name  string
	Value float64
	Label string // printed after the bar ("" prints the value)
	Color string // CSS color; "" picks from the palette
}

// BarChart is a horizontal bar chart drawn as a standalone SVG: one
// labelled bar per row, lengths from zero. It draws a single
// configuration's modes, where a line chart would have one x value.
type BarChart struct {
	Title, XLabel string
	Bars          []Bar
}

const barRow, barPadL, barPadR = 26, 120, 170

// SVG renders the chart.
func (c BarChart) SVG() []byte {
	vmax := 0.0
	for _, r := range c.Bars {
		if finite(r.Value) {
			vmax = math.Max(vmax, r.Value)
		}
	}
	xt := ticks(0, vmax)
	top := xt[len(xt)-1]
	w := float64(svgW - barPadL - barPadR)
	h := barRow * max(len(c.Bars), 1)
	height := padT + h + padB
	px := func(v float64) float64 { return barPadL + v/span(0, top)*w }

	var b strings.Builder
	svgHead(&b, height, c.Title)
	for _, t := range xt {
		x := px(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e0e0e0"/>`+"\n", x, padT, x, padT+h)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, padT+h+16, num(t))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", barPadL+w/2, height-12, esc(c.XLabel))
	for i, r := range c.Bars {
		color := r.Color
		if color == "" {
			color = palette[i%len(palette)]
		}
		y := padT + i*barRow
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", barPadL-8, y+barRow/2+4, esc(r.Name))
		if !finite(r.Value) {
			continue
		}
		end := px(math.Max(r.Value, 0))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", barPadL, y+4, end-barPadL, barRow-8, color)
		label := r.Label
		if label == "" {
			label = num(r.Value)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`+"\n", end+6, y+barRow/2+4, esc(label))
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", barPadL, padT, barPadL, padT+h)
	b.WriteString("</svg>\n")
	return []byte(b.String())
}
