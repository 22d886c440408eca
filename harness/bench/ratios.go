package bench

// The comparisons users read, derived from the results of one run.

import (
	"fmt"
	"strings"
)

// ratios derives the comparisons users read from the results of one run.
func ratios(r *Report) []Ratio {
	var out []Ratio
	results := func(scenario string) []Result {
		for _, s := range r.Scenarios {
			if s.Name == scenario {
				return s.Results
			}
		}
		return nil
	}
	find := func(scenario string, ok func(Result) bool) (Result, bool) {
		for _, x := range results(scenario) {
			if ok(x) {
				return x, true
			}
		}
		return Result{}, false
	}
	rate := func(x Result) string { return fmt.Sprintf("%s (%.0f %s)", describe(x), x.PerSecond, x.Unit) }
	add := func(name string, of, to Result, value float64, ofText, toText string) {
		if value > 0 && !isInf(value) {
			out = append(out, Ratio{Name: name, Value: value, Of: ofText, To: toText})
		}
	}
	throughput := func(name string, of, to Result) {
		if to.PerSecond > 0 {
			add(name, of, to, of.PerSecond/to.PerSecond, rate(of), rate(to))
		}
	}
	latency := func(name string, of, to Result) {
		if to.P50us > 0 {
			add(name, of, to, of.P50us/to.P50us, describe(of)+" p50 "+fmtUs(of.P50us), describe(to)+" p50 "+fmtUs(to.P50us))
		}
	}

	// claims
	var best Result
	for _, x := range results("claims") {
		if x.PerSecond > best.PerSecond {
			best = x
		}
	}
	at8, has8 := find("claims", func(x Result) bool { return x.Workers == 8 && x.Batch == 100 })
	bulk, hasBulk := find("baselines", func(x Result) bool { return x.Name == "bulk UPDATE (ceiling)" })
	bulkFx, hasBulkFx := find("baselines", func(x Result) bool { return x.Name == "bulk UPDATE + effects (ceiling)" })
	if best.PerSecond > 0 {
		if hasBulk {
			throughput("pgclaim best claim throughput / bulk UPDATE ceiling", best, bulk)
		}
		if hasBulkFx {
			throughput("pgclaim best claim throughput / bulk UPDATE + effects", best, bulkFx)
		}
		if has8 && hasBulk {
			throughput("pgclaim (8 workers, batch 100) / bulk UPDATE ceiling", at8, bulk)
		}
		for _, x := range results("baselines") {
			if strings.HasPrefix(x.Name, "field loop") {
				throughput(fmt.Sprintf("pgclaim best claim throughput / field loop, %d instances", x.Workers), best, x)
				if has8 {
					throughput(fmt.Sprintf("pgclaim (8 workers, batch 100) / field loop, %d instances", x.Workers), at8, x)
				}
			}
		}
	}
	for _, h := range results("baselines") {
		if h.Name != "hand-written SKIP LOCKED SQL" {
			continue
		}
		pg, ok := find("baselines", func(x Result) bool {
			return x.Name == "pgclaim ClaimBatch + FinishBatch" && x.Workers == h.Workers && x.Batch == h.Batch
		})
		if ok {
			throughput(fmt.Sprintf("pgclaim / hand-written SQL (%d workers, batch %d)", h.Workers, h.Batch), pg, h)
			if pe, ok := find("baselines", func(x Result) bool {
				return x.Name == "hand-written SQL, claim planned per execution" && x.Workers == h.Workers && x.Batch == h.Batch
			}); ok {
				throughput(fmt.Sprintf("pgclaim / hand-written SQL planned per execution (%d workers, batch %d)", h.Workers, h.Batch), pg, pe)
			}
		}
		if w, ok := find("baselines", func(x Result) bool {
			return strings.HasPrefix(x.Name, "pgclaim claim.Worker") && x.Workers == h.Workers && x.Batch == h.Batch
		}); ok {
			throughput(fmt.Sprintf("claim.Worker / hand-written SQL (%d workers, batch %d)", h.Workers, h.Batch), w, h)
		}
	}

	// gates: single contender latency and throughput
	gate1 := func(name string) (Result, bool) {
		return find("gates", func(x Result) bool { return x.Name == name && x.Workers == 1 })
	}
	shed, hasShed := gate1("ShedLock-style lock table")
	bare, hasBare := gate1("bare advisory lock (dedicated conn)")
	for _, n := range []string{"gate.Once (ledger + advisory)", "gate.Once, LedgerOnly", "gate.Lease.Do (lease row)", "gate.Exclusive (advisory)"} {
		g, ok := gate1(n)
		if !ok {
			continue
		}
		if hasShed {
			latency(n+" cycle latency / ShedLock-style cycle", g, shed)
			throughput(n+" cycles/s / ShedLock-style cycles/s", g, shed)
		}
		if n == "gate.Exclusive (advisory)" && hasBare {
			latency(n+" cycle latency / bare advisory lock", g, bare)
		}
	}
	// gates: each mechanism against its own statements sent by hand (the
	// library's client cost), and those statements and the ledger's floor
	// against the baselines (what the guarantee costs the server).
	for _, f := range []struct{ mech, floor, base string }{
		{"gate.Once (ledger + advisory)", gateFloorOnce, ""},
		{"gate.Exclusive (advisory)", gateFloorExclusive, "bare advisory lock (dedicated conn)"},
		{"gate.Lease.Do (lease row)", gateFloorLease, "ShedLock-style lock table"},
		{"", gateFloorOnce, "ShedLock-style lock table"},
		{"", gateFloorLedger, "ShedLock-style lock table"},
		{"", gateFloorFenced, "ShedLock-style lock table"},
	} {
		fl, ok := gate1(f.floor)
		if !ok {
			continue
		}
		if g, ok := gate1(f.mech); ok {
			latency(f.mech+" cycle latency / its statements sent by hand", g, fl)
		}
		if b, ok := gate1(f.base); ok {
			latency(f.floor+" cycle latency / "+f.base, fl, b)
		}
	}
	// gates: several contenders on one job, ticks fired together, against
	// the ShedLock-style table's acquisitions with as many contenders.
	for _, g := range results("gates") {
		if g.Name != "gate.Once (ledger + advisory)"+gateTogether {
			continue
		}
		if s, ok := find("gates", func(y Result) bool { return y.Name == "ShedLock-style lock table" && y.Workers == g.Workers }); ok {
			throughput(fmt.Sprintf("gate.Once ticks/s, %d contenders firing together / ShedLock-style acquisitions/s, %d contenders", g.Workers, g.Workers), g, s)
		}
		// The same rounds with Once's statements sent by hand, and with
		// the ledger's floor, whose own ratio to ShedLock's acquisitions
		// bounds what any ledger of instants reaches in these rounds.
		if f, ok := find("gates", func(y Result) bool { return y.Name == gateFloorOnce+gateTogether && y.Workers == g.Workers }); ok {
			throughput(fmt.Sprintf("gate.Once ticks/s / its statements sent by hand, %d contenders firing together", g.Workers), g, f)
		}
		for _, floor := range []string{gateFloorLedger, gateFloorFenced} {
			f, ok := find("gates", func(y Result) bool { return y.Name == floor+gateTogether && y.Workers == g.Workers })
			if !ok {
				continue
			}
			throughput(fmt.Sprintf("gate.Once ticks/s / %s ticks/s, %d contenders firing together", floor, g.Workers), g, f)
			if s, ok := find("gates", func(y Result) bool { return y.Name == "ShedLock-style lock table" && y.Workers == g.Workers }); ok {
				throughput(fmt.Sprintf("%s ticks/s, %d contenders firing together / ShedLock-style acquisitions/s, %d contenders", floor, g.Workers, g.Workers), f, s)
			}
		}
		// The same rounds with the ShedLock-style table: the ticks it
		// resolved, each counted once however many times it ran.
		if s, ok := find("gates", func(y Result) bool {
			return y.Name == "ShedLock-style lock table"+gateTogether && y.Workers == g.Workers
		}); ok && s.Seconds > 0 {
			distinct := (float64(s.Ops) - s.Extra["duplicates"]) / s.Seconds
			if distinct > 0 {
				add(fmt.Sprintf("gate.Once ticks/s / ShedLock-style ticks resolved/s, %d contenders firing together (ShedLock's ticks counted once however often they ran)", g.Workers),
					g, s, g.PerSecond/distinct, rate(g), fmt.Sprintf("%s (%.0f ticks/s, %.0f runs/s)", describe(s), distinct, s.PerSecond))
			}
		}
	}

	// sweeper
	if sw, ok := find("sweeper", func(x Result) bool { return x.Name == "claim.Sweeper" && x.Workers == 1 }); ok {
		if big, ok := find("sweeper", func(x Result) bool { return x.Group == "baseline" }); ok {
			throughput("claim.Sweeper rows/s / one giant UPDATE", sw, big)
			if a, b := sw.Extra["longest_statement_ms"], big.Extra["longest_statement_ms"]; a > 0 && b > 0 {
				add("claim.Sweeper longest statement / giant UPDATE's", sw, big, a/b, fmtMs(a), fmtMs(b))
			}
		}
	}

	// failover
	fo := func(prefix, fault string, ttlMs float64) (Result, bool) {
		return find("failover", func(x Result) bool {
			return strings.HasPrefix(x.Name, prefix) && strings.HasSuffix(x.Name, fault) && (ttlMs < 0 || x.Extra["ttl_ms"] == ttlMs)
		})
	}
	if poll, ok := fo("standby polling", "terminate", -1); ok {
		if el, ok := fo("gate.Elector (advisory)", "terminate", -1); ok {
			latency("Elector failover (terminated backend) / polling standby", el, poll)
		}
	}
	if poll, ok := fo("standby polling", "kill", -1); ok {
		if el, ok := fo("gate.Elector (advisory)", "kill", 500); ok {
			latency("Elector failover (SIGKILL, TTL 500ms) / polling standby", el, poll)
		}
	}

	// scale
	var idx []Result
	for _, x := range results("scale") {
		if x.Name == "ClaimBatch, partial index" {
			idx = append(idx, x)
		}
	}
	if len(idx) >= 2 {
		first, last := idx[0], idx[len(idx)-1]
		if first.P50us > 0 {
			add(fmt.Sprintf("ClaimBatch p50 at %d rows / at %d rows (partial index)", last.TableRows, first.TableRows), last, first,
				last.P50us/first.P50us, fmtUs(last.P50us), fmtUs(first.P50us))
		}
	}
	// instances: the most instance processes against the fewest, for each
	// way in (straight or behind PgBouncer) and each claim (Spread or not)
	type way struct{ pooled, spread, hand bool }
	byWay := map[way][]Result{}
	for _, x := range results("instances") {
		w := way{strings.Contains(x.Name, "PgBouncer"), strings.Contains(x.Name, "Spread"), strings.Contains(x.Name, "hand-written")}
		byWay[w] = append(byWay[w], x)
	}
	for _, w := range []way{{false, false, false}, {true, false, false}, {false, true, false}, {true, true, false}, {false, false, true}, {true, false, true}} {
		xs := byWay[w]
		if len(xs) < 2 {
			continue
		}
		what := "claim rows/s"
		if w.hand {
			what = "hand-written SQL rows/s"
		}
		if w.pooled {
			what += " behind PgBouncer"
		}
		if w.spread {
			what += ", Config.Spread"
		}
		throughput(fmt.Sprintf("%s, %d instance processes / %d", what, xs[len(xs)-1].Workers, xs[0].Workers), xs[len(xs)-1], xs[0])
	}
	// instances: pgclaim's claims against the hand-written loop at the same
	// count, the same way in
	for _, pooled := range []bool{false, true} {
		for _, h := range byWay[way{pooled: pooled, hand: true}] {
			for _, w := range []way{{pooled: pooled}, {pooled: pooled, spread: true}} {
				for _, x := range byWay[w] {
					if x.Workers == h.Workers {
						what := "pgclaim claims"
						if w.spread {
							what += " (Config.Spread)"
						}
						if pooled {
							what += " behind PgBouncer"
						}
						throughput(fmt.Sprintf("%s / hand-written SQL, rows/s, %d instance processes", what, x.Workers), x, h)
					}
				}
			}
		}
	}
	// schedules: the scheduler against gate.Once on a timer, same instances
	// and jobs
	for _, sc := range results("schedules") {
		if sc.Name != "schedule.Scheduler, due every second" {
			continue
		}
		if g, ok := find("schedules", func(x Result) bool {
			return x.Name == "gate.Once on a timer, every second" && x.Extra["schedules"] == sc.Extra["schedules"]
		}); ok {
			size := fmt.Sprintf(" (%d instances × %.0f schedules)", sc.Workers, sc.Extra["schedules"])
			perInstant := func(name, key string, f func(float64) string) {
				if a, b := sc.Extra[key], g.Extra[key]; a > 0 && b > 0 {
					add(name+size, sc, g, a/b, "scheduler "+f(a), "gate.Once "+f(b))
				}
			}
			perInstant("Scheduler statements per instant run / gate.Once's", "statements_per_run", func(v float64) string { return fmt.Sprintf("%.1f", v) })
			perInstant("Scheduler server exec per instant run / gate.Once's", "exec_ms_per_run", fmtMs)
			if sc.P50us > 0 && g.P50us > 0 {
				add("Scheduler wake-up lag / gate.Once on a timer's"+size, sc, g, sc.P50us/g.P50us, "scheduler p50 "+fmtUs(sc.P50us), "gate.Once p50 "+fmtUs(g.P50us))
			}
			if sc.P99us > 0 && g.P99us > 0 {
				add("Scheduler wake-up lag p99 / gate.Once on a timer's"+size, sc, g, sc.P99us/g.P99us, "scheduler p99 "+fmtUs(sc.P99us), "gate.Once p99 "+fmtUs(g.P99us))
			}
		}
	}
	// herd: pgclaim's scheduler and the robfig path against River's
	// periodic jobs, shape by shape.
	for _, rv := range results("herd") {
		shape, ok := strings.CutSuffix(rv.Name, ", river")
		if !ok {
			continue
		}
		for _, side := range []string{"pgclaim", "robfig"} {
			pg, ok := find("herd", func(x Result) bool { return x.Name == shape+", "+side })
			if !ok {
				continue
			}
			if pg.P99us > 0 && rv.P99us > 0 {
				add(shape+": start lag p99, "+side+" / River", pg, rv, pg.P99us/rv.P99us, side+" p99 "+fmtUs(pg.P99us), "River p99 "+fmtUs(rv.P99us))
			}
			if a, b := pg.Extra["backends_peak"], rv.Extra["backends_peak"]; a > 0 && b > 0 {
				add(shape+": backends, "+side+" / River", pg, rv, a/b, fmt.Sprintf("%s %.0f", side, a), fmt.Sprintf("River %.0f", b))
			}
			if a, b := pg.Extra["transactions_per_instant"], rv.Extra["transactions_per_instant"]; a > 0 && b > 0 {
				add(shape+": transactions per instant, "+side+" / River", pg, rv, a/b, fmt.Sprintf("%s %.0f", side, a), fmt.Sprintf("River %.0f", b))
			}
		}
	}
	return out
}

func describe(x Result) string {
	s := x.Name
	var p []string
	if x.Workers > 0 && x.Unit != "failovers" {
		if x.Unit == "cycles/s" {
			p = append(p, fmt.Sprintf("%d contenders", x.Workers))
		} else {
			p = append(p, fmt.Sprintf("%d workers", x.Workers))
		}
	}
	if x.Batch > 0 {
		p = append(p, fmt.Sprintf("batch %d", x.Batch))
	}
	if len(p) > 0 {
		s += " (" + strings.Join(p, ", ") + ")"
	}
	return s
}

func isInf(f float64) bool { return f > 1e300 || f < -1e300 || f != f }
