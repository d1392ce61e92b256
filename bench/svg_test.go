package bench

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

// TestChartSVG checks the chart is well-formed XML with a polyline per
// series, a legend entry per name (escaped), and points inside the plot.
func TestChartSVG(t *testing.T) {
	c := Chart{Title: "latency <vs> budget", XLabel: "budget", YLabel: "ms", YFromZero: true, Series: []Series{
		{Name: "stdpl & co", X: []float64{25, 50, 75}, Y: []float64{300, 200, 120}},
		{Name: "bound", X: []float64{25, 50, 75}, Y: []float64{250, 170, 90}, Dashed: true},
		{Name: "gaps", X: []float64{25, 50}, Y: []float64{math.NaN(), 10}},
	}}
	svg := string(c.SVG())
	polylines := svgElements(t, svg, "polyline")
	for _, se := range polylines {
		for _, a := range se.Attr {
			if a.Name.Local != "points" {
				continue
			}
			for _, p := range strings.Fields(a.Value) {
				var x, y float64
				if _, err := fmt.Sscanf(p, "%g,%g", &x, &y); err != nil || x < padL-0.5 || x > padL+plotW+0.5 || y < padT-0.5 || y > padT+plotH+0.5 {
					t.Errorf("point %q outside the plot area (%v)", p, err)
				}
			}
		}
	}
	if len(polylines) != 3 {
		t.Errorf("%d polylines, want 3", len(polylines))
	}
	for _, want := range []string{"stdpl &amp; co", "latency &lt;vs&gt; budget", "stroke-dasharray"} {
		if !strings.Contains(svg, want) {
			t.Errorf("svg lacks %q", want)
		}
	}
	if empty := string(Chart{}.SVG()); !strings.HasSuffix(empty, "</svg>\n") {
		t.Error("empty chart is not a whole svg")
	}
}

func TestTicks(t *testing.T) {
	for _, tc := range []struct{ lo, hi float64 }{{0, 1177}, {25, 100}, {0.3, 0.31}, {5, 5}, {0, 1e9}} {
		ts := ticks(tc.lo, tc.hi)
		if len(ts) < 2 || len(ts) > 12 || ts[0] > tc.lo || ts[len(ts)-1] < tc.hi {
			t.Errorf("ticks(%g, %g) = %v", tc.lo, tc.hi, ts)
		}
	}
}

// TestBarChartSVG checks the bar chart is well-formed XML with one bar per
// finite value, lengths in proportion, and names and labels escaped.
func TestBarChartSVG(t *testing.T) {
	c := BarChart{Title: "modes <25%>", XLabel: "ms", Bars: []Bar{
		{Name: "std", Value: 1200},
		{Name: "tree & co", Value: 300, Label: "300 ms, 4.6 tokens/pass"},
		{Name: "none", Value: math.NaN()},
	}}
	svg := string(c.SVG())
	var widths []float64
	for _, se := range svgElements(t, svg, "rect") {
		x, w := attr(se, "x"), attr(se, "width")
		if x != fmt.Sprint(barPadL) {
			continue // the background
		}
		var v float64
		fmt.Sscanf(w, "%g", &v)
		widths = append(widths, v)
	}
	if len(widths) != 2 {
		t.Fatalf("%d bars, want 2 (the NaN one drawn without a bar)", len(widths))
	}
	if r := widths[0] / widths[1]; math.Abs(r-4) > 0.01 {
		t.Errorf("bar lengths %v are not in the values' ratio 4", widths)
	}
	for _, want := range []string{"tree &amp; co", "modes &lt;25%&gt;", "300 ms, 4.6 tokens/pass", ">1200<", ">none<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("svg lacks %q", want)
		}
	}
	if empty := string(BarChart{}.SVG()); !strings.HasSuffix(empty, "</svg>\n") {
		t.Error("empty chart is not a whole svg")
	}
}

// TestSpecPlotShape checks SpecPlot draws lines across storages and bars
// for a single one (where a line chart would have one x value).
func TestSpecPlotShape(t *testing.T) {
	result := func(mode string, bw float64, ms int) SpecResult {
		return SpecResult{Config: SpecConfig{Mode: SpecMode{Name: mode}, Bandwidth: bw},
			Token: time.Duration(ms) * time.Millisecond, Passes: 10, Emitted: 46}
	}
	one := string(SpecPlot([]SpecResult{result("std", 400e6, 1166), result("tree", 400e6, 295)}, "one storage"))
	if strings.Contains(one, "<polyline") || !strings.Contains(one, "295 ms, 4.60 tokens/pass") {
		t.Errorf("single storage: want bars labelled with ms and tokens/pass\n%s", one)
	}
	two := string(SpecPlot([]SpecResult{result("std", 400e6, 1166), result("std", 1.5e9, 362)}, "two storages"))
	if !strings.Contains(two, "<polyline") {
		t.Errorf("two storages: want a line chart\n%s", two)
	}
}

// svgElements parses svg, failing t unless it is well-formed XML, and
// returns its elements named name.
func svgElements(t *testing.T, svg, name string) []xml.StartElement {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(svg))
	var out []xml.StartElement
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == name {
			out = append(out, se.Copy())
		}
	}
}

// attr is an element's attribute value ("" when absent).
func attr(se xml.StartElement, name string) string {
	for _, a := range se.Attr {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}
