package sim

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// WriteSVG draws the series: demand (jobs running or waiting), slots of
// ready instances, and instances billed (times the capacity, so all three
// read in slots), against time.
func WriteSVG(w io.Writer, r Result, capacity int, title string) error {
	const (
		width, height = 960, 400
		left, right   = 60, 20
		top, bottom   = 40, 50
	)
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	maxY := 1
	// Time runs from the first sample (a run may start after Monday
	// 00:00: Config.From).
	var t0 time.Duration
	if len(r.Series) > 0 {
		t0 = r.Series[0].At
	}
	var maxT time.Duration = time.Minute
	for _, s := range r.Series {
		maxY = max(maxY, s.Demand, s.SlotsReady, s.Instances*capacity)
		maxT = max(maxT, s.At-t0)
	}
	maxY = niceCeil(maxY)
	x := func(t time.Duration) float64 { return float64(left) + pw*float64(t-t0)/float64(maxT) }
	y := func(v int) float64 { return float64(top) + ph*(1-float64(v)/float64(maxY)) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">%s</text>`+"\n", left, escape(title))
	// Axes and grid.
	for i := 0; i <= 4; i++ {
		v := maxY * i / 4
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(v), width-right, y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%d</text>`+"\n", left-6, y(v)+4, v)
	}
	step := time.Hour
	for maxT/step > 12 {
		step *= 2
	}
	for maxT/step < 3 && step > time.Minute {
		step /= 2
	}
	for t := t0; t <= t0+maxT; t += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", x(t), top, x(t), height-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(t), height-bottom+16, clockLabel(t))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">time (from Monday 00:00)</text>`+"\n", left+int(pw/2), height-12)
	fmt.Fprintf(&b, `<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">slots</text>`+"\n", top+int(ph/2), top+int(ph/2))
	series := []struct {
		name, color string
		v           func(Sample) int
	}{
		{"instances × capacity", "#bbb", func(s Sample) int { return s.Instances * capacity }},
		{"slots ready", "#2a7", func(s Sample) int { return s.SlotsReady }},
		{"demand (running + waiting)", "#c33", func(s Sample) int { return s.Demand }},
	}
	for i, s := range series {
		var pts strings.Builder
		for _, p := range r.Series {
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(p.At), y(s.v(p)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%d" points="%s"/>`+"\n", s.color, []int{4, 2, 1}[i], strings.TrimSpace(pts.String()))
	}
	// Legend, top right.
	for i, s := range series {
		ly := top + 14 + i*16
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`, width-right-210, ly-4, width-right-190, ly-4, s.color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", width-right-184, ly, escape(s.name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func clockLabel(t time.Duration) string {
	d := int(t / (24 * time.Hour))
	h := int(t/time.Hour) % 24
	m := int(t/time.Minute) % 60
	if d > 0 {
		return fmt.Sprintf("d%d %02d:%02d", d+1, h, m)
	}
	return fmt.Sprintf("%02d:%02d", h, m)
}

func niceCeil(v int) int {
	for _, n := range []int{4, 8, 12, 20, 40, 60, 80, 100, 120, 160, 200, 400, 800, 1000} {
		if v <= n {
			return n
		}
	}
	return (v + 999) / 1000 * 1000
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
