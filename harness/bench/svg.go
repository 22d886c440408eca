package bench

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strconv"
	"strings"
)

// claimsSVG draws claim throughput against workers, one line per batch
// size, with the field loop as a dashed line; nil when the claims scenario
// has no results.
func claimsSVG(r *Report) []byte {
	var claims, base []Result
	for _, s := range r.Scenarios {
		switch s.Name {
		case "claims":
			claims = s.Results
		case "baselines":
			base = s.Results
		}
	}
	if len(claims) == 0 {
		return nil
	}
	type series struct {
		label  string
		color  string
		dashed bool
		pts    map[int]float64 // workers → rows/s
	}
	palette := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"}
	var workers []int
	byBatch := map[int]*series{}
	var batches []int
	for _, x := range claims {
		if !slices.Contains(workers, x.Workers) {
			workers = append(workers, x.Workers)
		}
		s, ok := byBatch[x.Batch]
		if !ok {
			s = &series{label: fmt.Sprintf("batch %d", x.Batch), pts: map[int]float64{}}
			byBatch[x.Batch] = s
			batches = append(batches, x.Batch)
		}
		s.pts[x.Workers] = x.PerSecond
	}
	slices.Sort(batches)
	var all []*series
	for i, b := range batches {
		s := byBatch[b]
		s.color = palette[i%len(palette)]
		all = append(all, s)
	}
	field := &series{label: "field loop (instances)", color: "#555555", dashed: true, pts: map[int]float64{}}
	var ceiling float64
	for _, x := range base {
		switch {
		case strings.HasPrefix(x.Name, "field loop"):
			field.pts[x.Workers] = x.PerSecond
			if !slices.Contains(workers, x.Workers) {
				workers = append(workers, x.Workers)
			}
		case x.Name == "bulk UPDATE (ceiling)":
			ceiling = x.PerSecond
		}
	}
	if len(field.pts) > 0 {
		all = append(all, field)
	}
	slices.Sort(workers)

	const (
		W, H                     = 760, 440
		left, right, top, bottom = 80, 190, 60, 60
	)
	pw, ph := float64(W-left-right), float64(H-top-bottom)
	ymax := 0.0
	for _, s := range all {
		for _, v := range s.pts {
			ymax = math.Max(ymax, v)
		}
	}
	ymax = niceCeil(ymax * 1.05)
	if ymax <= 0 {
		ymax = 1
	}
	xpos := func(w int) float64 {
		i := slices.Index(workers, w)
		if len(workers) == 1 {
			return float64(left) + pw/2
		}
		return float64(left) + pw*float64(i)/float64(len(workers)-1)
	}
	ypos := func(v float64) float64 { return float64(top) + ph*(1-v/ymax) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">pgclaim claim + finish throughput (rows/s)</text>`+"\n", left)
	pgv, _, _ := strings.Cut(r.Machine.Postgres, " ")
	sub := fmt.Sprintf("%d CPUs, PostgreSQL %s; claim batch, then finish + effect in one transaction", r.Machine.CPUs, pgv)
	if ceiling > 0 {
		sub += fmt.Sprintf("; bulk UPDATE: %s rows/s", human(ceiling))
	}
	fmt.Fprintf(&b, `<text x="%d" y="42" fill="#444">%s</text>`+"\n", left, html.EscapeString(sub))
	// grid and y labels
	for i := 0; i <= 5; i++ {
		v := ymax * float64(i) / 5
		y := ypos(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e0e0e0"/>`+"\n", left, y, W-right, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" fill="#444">%s</text>`+"\n", left-8, y+4, axisLabel(v))
	}
	// x axis
	for _, w := range workers {
		x := xpos(w)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e0e0e0"/>`+"\n", x, top, x, H-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%d</text>`+"\n", x, H-bottom+18, w)
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888"/>`+"\n", left, H-bottom, W-right, H-bottom)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888"/>`+"\n", left, top, left, H-bottom)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">workers (field loop: instances)</text>`+"\n", float64(left)+pw/2, H-bottom+40)
	fmt.Fprintf(&b, `<text x="18" y="%.1f" text-anchor="middle" transform="rotate(-90 18 %.1f)">rows/s</text>`+"\n", float64(top)+ph/2, float64(top)+ph/2)
	// series
	for i, s := range all {
		var ws []int
		for w := range s.pts {
			ws = append(ws, w)
		}
		slices.Sort(ws)
		var pts []string
		for _, w := range ws {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xpos(w), ypos(s.pts[w])))
		}
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.color, dash, strings.Join(pts, " "))
		for _, w := range ws {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s, %d: %.0f rows/s</title></circle>`+"\n",
				xpos(w), ypos(s.pts[w]), s.color, html.EscapeString(s.label), w, s.pts[w])
		}
		ly := top + 10 + i*22
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", W-right+16, ly, W-right+40, ly, s.color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", W-right+46, ly+4, html.EscapeString(s.label))
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 0
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// axisLabel formats a tick value: 0, 500, 10k, 2.5k, 1.2M.
func axisLabel(v float64) string {
	trim := func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
	switch {
	case v >= 1e6:
		return trim(math.Round(v/1e5)/10) + "M"
	case v >= 1e3:
		return trim(math.Round(v/1e2)/10) + "k"
	default:
		return trim(math.Round(v))
	}
}
