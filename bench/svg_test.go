package bench

import (
	"encoding/xml"
	"fmt"
	"math"
	"strings"
	"testing"
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
	dec := xml.NewDecoder(strings.NewReader(svg))
	polylines := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("not well-formed: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			polylines++
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
	}
	if polylines != 3 {
		t.Errorf("%d polylines, want 3", polylines)
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
