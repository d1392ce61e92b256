package bench

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// schedPanel is one line chart: a value per policy per load.
type schedPanel struct {
	title string
	unit  string
	log   bool
	value func(SchedRow) float64
}

var schedPanels = []schedPanel{
	{"p99 response time", "s", true, func(r SchedRow) float64 { return r.P99.Seconds() }},
	{"mean response time", "s", true, func(r SchedRow) float64 { return r.Mean.Seconds() }},
	{"deadlines met", "%", false, func(r SchedRow) float64 { return r.Attainment }},
	{"utility", "%", false, func(r SchedRow) float64 { return r.Utility }},
}

var policyColors = map[string]string{
	"tandem": "#d62728", "fifo": "#1f77b4", "luf": "#2ca02c", "edf": "#9467bd", "rtlm": "#ff7f0e",
}

// SchedSVG draws, for each setting (engine, adversarial share, variance)
// in rows, a row of panels against the offered load, one line per
// policy. It is a self-contained SVG document.
func SchedSVG(rows []SchedRow) string {
	type key struct {
		engine, variance string
		adv              float64
	}
	var keys []key
	for _, r := range rows {
		k := key{r.Engine, r.Variance, r.Adversarial}
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	const pw, ph, pad = 300.0, 210.0, 48.0
	width := pad + float64(len(schedPanels))*(pw+pad)
	height := 30 + float64(len(keys))*(ph+pad+30)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	var policies []string
	for _, r := range rows {
		if !slices.Contains(policies, r.Policy) {
			policies = append(policies, r.Policy)
		}
	}
	for i, p := range policies { // legend
		x := pad + float64(i)*110
		fmt.Fprintf(&b, `<line x1="%.0f" y1="16" x2="%.0f" y2="16" stroke="%s" stroke-width="2"/><text x="%.0f" y="20">%s</text>`+"\n",
			x, x+20, schedColor(p), x+25, html.EscapeString(p))
	}
	for ki, k := range keys {
		y0 := 30 + float64(ki)*(ph+pad+30)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="13">%s, %.0f%% adversarial, %s variance</text>`+"\n",
			pad, y0+16, html.EscapeString(k.engine), 100*k.adv, k.variance)
		var sel []SchedRow
		for _, r := range rows {
			if r.Engine == k.engine && r.Variance == k.variance && r.Adversarial == k.adv {
				sel = append(sel, r)
			}
		}
		for pi, p := range schedPanels {
			schedPanelDraw(&b, pad+float64(pi)*(pw+pad), y0+30, pw, ph, p, sel, policies)
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func schedColor(policy string) string {
	if c, ok := policyColors[strings.Fields(policy)[0]]; ok {
		return c
	}
	return "#7f7f7f"
}

func schedPanelDraw(b *strings.Builder, x0, y0, w, h float64, p schedPanel, rows []SchedRow, policies []string) {
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, r := range rows {
		v := p.value(r)
		if p.log && v <= 0 {
			continue
		}
		xmin, xmax = math.Min(xmin, r.Load), math.Max(xmax, r.Load)
		ymin, ymax = math.Min(ymin, v), math.Max(ymax, v)
	}
	if math.IsInf(xmin, 0) {
		return
	}
	if !p.log {
		ymin, ymax = 0, math.Max(ymax, 100)
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	ty := func(v float64) float64 {
		if p.log {
			lo, hi := math.Log10(ymin), math.Log10(ymax)
			if hi == lo {
				hi = lo + 1
			}
			return y0 + h - (math.Log10(v)-lo)/(hi-lo)*h
		}
		return y0 + h - (v-ymin)/(ymax-ymin)*h
	}
	tx := func(v float64) float64 { return x0 + (v-xmin)/(xmax-xmin)*w }
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#999"/>`+"\n", x0, y0, w, h)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f">%s (%s%s)</text>`+"\n", x0, y0-6, p.title, p.unit, map[bool]string{true: ", log", false: ""}[p.log])
	for _, v := range []float64{ymin, ymax} {
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-3, ty(v)+4, schedShort(v))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f">%s</text><text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n",
		x0, y0+h+14, schedShort(xmin), x0+w, y0+h+14, schedShort(xmax))
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">offered load</text>`+"\n", x0+w/2, y0+h+14)
	for _, pol := range policies {
		var pts []string
		var xs []SchedRow
		for _, r := range rows {
			if r.Policy == pol && !(p.log && p.value(r) <= 0) {
				xs = append(xs, r)
			}
		}
		slices.SortFunc(xs, func(a, c SchedRow) int { return schedCmp(a.Load, c.Load) })
		for _, r := range xs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", tx(r.Load), ty(p.value(r))))
		}
		if len(pts) > 0 {
			fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.8"/>`+"\n", strings.Join(pts, " "), schedColor(pol))
		}
	}
}

func schedCmp(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func schedShort(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2g", v)
}
