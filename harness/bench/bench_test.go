package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/pgtest"
)

func TestMain(m *testing.M) {
	// The failover scenario re-runs the test binary as its children.
	MaybeRunChild()
	os.Exit(m.Run())
}

// tinyParams is the quick mode at an even smaller scale: every scenario and
// every check runs, in well under a minute.
func tinyParams() *params {
	return &params{
		ClaimRows:    2000,
		ClaimWorkers: []int{1, 4},
		ClaimBatches: []int{10, 100},
		ClaimTimeBox: 5 * time.Second,

		FieldInstances: []int{2},
		BulkRepeats:    1,
		Compare:        []point{{4, 10}},
		WorkerRows:     500,

		GateDuration:   300 * time.Millisecond,
		GateContenders: []int{1, 4},

		SweepRows:     5000,
		SweepBatch:    500,
		SweepSweepers: []int{1, 2},
		SweepTimeBox:  30 * time.Second,

		FailoverRounds: 2,

		ScaleSizes:          []int64{10_000},
		ScaleClaimable:      200,
		ScaleBatch:          50,
		ScaleSamples:        10,
		ScaleNoIndexMax:     10_000,
		ScaleNoIndexSamples: 3,

		Instances:      []int{2},
		InstanceRows:   20_000,
		InstanceWindow: 1500 * time.Millisecond,
		InstanceProcs:  1,

		SchedInstances:     2,
		SchedSchedules:     5,
		SchedBusySchedules: []int{5},
		SchedWarmup:        1500 * time.Millisecond,
		SchedSettle:        5 * time.Second,
		SchedIdle:          2 * time.Second,
		SchedBusy:          3 * time.Second,

		HerdShapes: []herdShape{
			// Six instants: a starved CI machine can stall a process for a
			// few seconds, and a 1 s schedule's instants overtaken meanwhile
			// are skipped (catch-up latest), not run.
			{Instances: 2, Schedules: 5, Period: time.Second, Instants: 6, Sides: []string{"pgclaim", "robfig"}},
			{Instances: 2, Schedules: 5, Period: time.Second, Instants: 6, Processes: true, Bouncer: true, Sides: []string{"pgclaim"}},
		},

		LatencySamples:         5,
		LatencyInterval:        100 * time.Millisecond,
		LatencyIdle:            time.Second,
		LatencySettle:          200 * time.Millisecond,
		LatencyStampede:        stampede{Instances: 2, Workers: 2},
		LatencyStampedeSamples: 5,
		LatencyClaimWorkers:    4,
		LatencyClaimRows:       2000,
		LatencyClaimBatches:    []int{100},
		LatencyClaimRepeats:    1,
	}
}

// TestBenchSchedules runs the schedules scenario at a tiny size: it reports
// the idle cost, the cost per instant and the wake-up lag of the scheduler
// and of gate.Once, their same-run ratios, and no instant run twice.
func TestBenchSchedules(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rep, err := Run(ctx, Config{Quick: true, Scenarios: []string{"schedules"}, Progress: &progress, params: tinyParams(), server: srv})
	if err != nil {
		if rep != nil {
			t.Logf("problems: %v", rep.Problems())
		}
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	if len(rep.Scenarios) != 1 || rep.Scenarios[0].Name != "schedules" {
		t.Fatalf("scenarios: %+v", rep.Scenarios)
	}
	s := rep.Scenarios[0]
	byName := map[string]Result{}
	for _, r := range s.Results {
		byName[r.Name] = r
	}
	idle := byName["schedule.Scheduler, idle"]
	// Idle: the instances' polls, and far fewer than while due.
	if idle.PerSecond <= 0 || idle.Workers != 2 {
		t.Errorf("idle: %+v", idle)
	}
	for _, name := range []string{"schedule.Scheduler, due every second", "gate.Once on a timer, every second"} {
		r, ok := byName[name]
		if !ok {
			t.Fatalf("no result %q (have %v)", name, s.Results)
		}
		// About five instants a second, each with statements and a lag
		// that is positive and below the length of the run.
		if r.Ops < 5 || r.PerSecond <= 0 {
			t.Errorf("%s: %d instants, %.1f/s", name, r.Ops, r.PerSecond)
		}
		if spi := r.Extra["statements_per_run"]; spi < 1 || spi > 1000 {
			t.Errorf("%s: %.1f statements per run", name, spi)
		}
		if r.P50us <= 0 || r.P99us < r.P50us || r.MaxUs > 30e6 {
			t.Errorf("%s: lag p50 %.0f µs, p99 %.0f µs, max %.0f µs", name, r.P50us, r.P99us, r.MaxUs)
		}
		if r.Extra["due"] < float64(r.Ops) {
			t.Errorf("%s: %d runs of %.0f due instants", name, r.Ops, r.Extra["due"])
		}
		if r.Extra["statements_per_second"] <= idle.PerSecond {
			t.Errorf("%s: %.1f statements/s, not above the idle %.1f", name, r.Extra["statements_per_second"], idle.PerSecond)
		}
	}
	dupChecks := 0
	for _, c := range s.Checks {
		if !c.OK {
			t.Errorf("check %q: got %d, want %d", c.Name, c.Got, c.Want)
		}
		if strings.Contains(c.Name, "more than once") {
			dupChecks++
		}
	}
	if dupChecks != 2 {
		t.Errorf("%d duplicate checks, want 2 (scheduler, gate.Once): %+v", dupChecks, s.Checks)
	}
	names := map[string]bool{}
	for _, r := range rep.Ratios {
		names[r.Name] = true
	}
	for _, want := range []string{
		"Scheduler statements per instant run / gate.Once's (2 instances × 5 schedules)",
		"Scheduler wake-up lag / gate.Once on a timer's (2 instances × 5 schedules)",
	} {
		if !names[want] {
			t.Errorf("missing ratio %q (have %v)", want, names)
		}
	}
	var out bytes.Buffer
	if err := rep.WriteMarkdown(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"schedules — ", "scheduler, idle (none due)", "gate.Once on a timer, every second", "Ratios (same run)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("Markdown lacks %q:\n%s", want, out.String())
		}
	}
	t.Logf("\n%s", out.String())
}

func TestQuickRun(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	svg := filepath.Join(t.TempDir(), "claims.svg")
	rep, err := Run(ctx, Config{Quick: true, SVG: svg, Progress: &progress, params: tinyParams(), server: srv})
	if err != nil {
		if rep != nil {
			t.Logf("problems: %v", rep.Problems())
		}
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	if rep.Failed() {
		t.Fatalf("report failed: %v", rep.Problems())
	}

	// Every scenario ran, measured something and printed a table.
	if len(rep.Scenarios) != len(Scenarios) {
		t.Fatalf("got %d scenarios, want %d", len(rep.Scenarios), len(Scenarios))
	}
	for i, s := range rep.Scenarios {
		if s.Name != Scenarios[i] {
			t.Errorf("scenario %d is %q, want %q", i, s.Name, Scenarios[i])
		}
		if s.Error != "" {
			t.Errorf("%s: %s", s.Name, s.Error)
		}
		if len(s.Results) == 0 || len(s.Tables) == 0 || len(s.Setup) == 0 {
			t.Errorf("%s: %d results, %d tables, %d setup lines; want some of each", s.Name, len(s.Results), len(s.Tables), len(s.Setup))
		}
		for _, tb := range s.Tables {
			for _, row := range tb.Rows {
				if len(row) != len(tb.Columns) {
					t.Errorf("%s: table %q: row %v has %d cells for %d columns", s.Name, tb.Title, row, len(row), len(tb.Columns))
				}
			}
		}
		if len(s.Checks) == 0 && s.Name != "gates" {
			t.Errorf("%s: no checks", s.Name)
		}
	}

	// The zero-duplicate checks ran and held: claims, baselines, gates and
	// sweeper each count duplicates.
	dupChecks := 0
	for _, s := range rep.Scenarios {
		for _, c := range s.Checks {
			if !c.OK {
				t.Errorf("%s: check %q: got %d, want %d", s.Name, c.Name, c.Got, c.Want)
			}
			if strings.Contains(c.Name, "duplicate") || strings.Contains(c.Name, "more than once") || strings.Contains(c.Name, "overlapping") {
				dupChecks++
			}
		}
	}
	if dupChecks < 5 {
		t.Errorf("only %d duplicate checks in the report", dupChecks)
	}

	// Claims: one result per (workers, batch), every row of a drained
	// table moved, and each with a throughput.
	claims := rep.Scenarios[0]
	if got, want := len(claims.Results), 4; got != want {
		t.Errorf("claims: %d results, want %d", got, want)
	}
	for _, r := range claims.Results {
		if r.Ops <= 0 || r.PerSecond <= 0 || r.P50us <= 0 {
			t.Errorf("claims: result without figures: %+v", r)
		}
	}

	// Ratios against the baselines are derived.
	names := map[string]bool{}
	for _, r := range rep.Ratios {
		names[r.Name] = true
		if r.Value <= 0 {
			t.Errorf("ratio %q = %v", r.Name, r.Value)
		}
	}
	for _, want := range []string{
		"pgclaim best claim throughput / bulk UPDATE ceiling",
		"pgclaim best claim throughput / field loop, 2 instances",
		"gate.Once (ledger + advisory) cycle latency / ShedLock-style cycle",
		"pgclaim / hand-written SQL (4 workers, batch 10)",
	} {
		if !names[want] {
			t.Errorf("missing ratio %q (have %v)", want, names)
		}
	}

	// Failover measured every round (more of them for a terminated backend).
	for _, r := range rep.Scenarios[4].Results {
		want := int64(2)
		if strings.HasSuffix(r.Name, "/ terminate") {
			want *= terminateRounds
		}
		if r.Ops != want || r.P50us <= 0 {
			t.Errorf("failover: %d rounds, want %d: %+v", r.Ops, want, r)
		}
	}

	// Instances: every count ran, with claims and ticks.
	for _, r := range scenario(t, rep, "instances").Results {
		if r.PerSecond <= 0 || r.Extra["ticks_run"] <= 0 || r.Extra["server_connections_peak"] <= 0 {
			t.Errorf("instances: result without figures: %+v", r)
		}
	}

	// The outputs: JSON round-trips, text and Markdown carry every
	// scenario, the chart is well-formed SVG with one line per batch size.
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not decode: %v", err)
	}
	if len(back.Scenarios) != len(rep.Scenarios) || back.Machine.Postgres == "" {
		t.Errorf("JSON lost content: %d scenarios, postgres %q", len(back.Scenarios), back.Machine.Postgres)
	}
	for _, f := range []func(io.Writer) error{rep.WriteText, rep.WriteMarkdown} {
		var out bytes.Buffer
		if err := f(&out); err != nil {
			t.Fatal(err)
		}
		for _, s := range Scenarios {
			if !strings.Contains(out.String(), s+" — ") {
				t.Errorf("output lacks scenario %s:\n%s", s, out.String())
			}
		}
		if strings.Contains(out.String(), "— FAILED") {
			t.Errorf("output reports a failure:\n%s", out.String())
		}
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	lines := 0
	dec := xml.NewDecoder(bytes.NewReader(b))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != 3 { // two batch sizes and the field loop
		t.Errorf("chart has %d lines, want 3", lines)
	}
	if !strings.Contains(progress.String(), "claims: workers=4 batch=100") {
		t.Errorf("progress lacks the claims steps:\n%s", progress.String())
	}
}

func TestUnknownScenario(t *testing.T) {
	_, err := Run(context.Background(), Config{Scenarios: []string{"claims", "nope"}})
	if err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("err = %v, want one naming the unknown scenario", err)
	}
}

// scenario returns the report of the named scenario.
func scenario(t *testing.T, rep *Report, name string) *ScenarioReport {
	t.Helper()
	for _, s := range rep.Scenarios {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no scenario %q in the report", name)
	return nil
}

// runOne runs one scenario with p on srv, logs its text and returns its
// report and the text.
func runOne(t *testing.T, ctx context.Context, srv *pgtest.Server, name string, p *params) (*ScenarioReport, *bytes.Buffer) {
	t.Helper()
	var progress bytes.Buffer
	rep, err := Run(ctx, Config{Quick: true, Scenarios: []string{name}, Progress: &progress, params: p, server: srv})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	var out bytes.Buffer
	if err := rep.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	return rep.Scenarios[0], &out
}

// TestBenchHerd runs the herd scenario at a tiny size on a server of its
// own with max_connections = 100: every due (job, instant) ran once on both
// pgclaim sides (and with the instances as processes of their own),
// backends and lag were measured, and River's side runs too when
// PGCLAIM_BENCH_HERDRIVER names a built herdriver.
func TestBenchHerd(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := tinyParams()
	if os.Getenv(envHerdRiver) != "" {
		p.HerdShapes[0].Sides = append(p.HerdShapes[0].Sides, "river")
	}
	sc, out := runOne(t, ctx, srv, "herd", p)
	if len(sc.Results) != len(p.HerdShapes[0].Sides)+len(p.HerdShapes[1].Sides) {
		t.Fatalf("%d results, want one per side\n%s", len(sc.Results), out.String())
	}
	for _, r := range sc.Results {
		// Every due run once is the scheduler's to prove (schedule's
		// tests); here a loaded machine may let a 1 s cron tick pass its
		// MaxDelay. What must hold: nothing ran twice, and the side ran.
		if r.Extra["due"] != 30 || r.Ops == 0 || float64(r.Ops) > r.Extra["due"] || r.Extra["duplicates"] != 0 {
			t.Errorf("%s: ran %d of %v due, %v duplicates; want runs, none twice", r.Name, r.Ops, r.Extra["due"], r.Extra["duplicates"])
		}
		if float64(r.Ops) != r.Extra["due"] {
			t.Logf("%s: ran %d of %v due (a loaded machine)", r.Name, r.Ops, r.Extra["due"])
		}
		if r.Extra["backends_peak"] == 0 {
			t.Errorf("%s: no backends sampled", r.Name)
		}
		if r.P99us <= 0 || r.Extra["transactions_per_instant"] <= 0 {
			t.Errorf("%s: lag p99 %v µs, %v transactions per instant: not measured", r.Name, r.P99us, r.Extra["transactions_per_instant"])
		}
	}
}

// TestBenchLatency runs the latency scenario at a tiny size: every pgclaim
// row (trigger, claim.Notify, PollOnly), the stampede and the throughput
// check measured something and lost nothing; River's rows run too when
// PGCLAIM_BENCH_HERDRIVER names a built herdriver.
func TestBenchLatency(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := tinyParams()
	p.LatencyRiver = os.Getenv(envHerdRiver) != ""
	sc, out := runOne(t, ctx, srv, "latency", p)
	want := 3 + 1 + 2 // pgclaim's rows, the stampede, the throughput pair
	if p.LatencyRiver {
		want += 2
	}
	if len(sc.Results) != want {
		t.Fatalf("%d results, want %d\n%s", len(sc.Results), want, out.String())
	}
	for _, r := range sc.Results {
		if r.Unit == "rows/s" {
			if r.PerSecond <= 0 {
				t.Errorf("%s: no throughput", r.Name)
			}
			continue
		}
		if r.Ops != int64(p.LatencySamples) || r.P50us <= 0 || r.P99us < r.P50us {
			t.Errorf("%s: %d samples, p50 %v µs, p99 %v µs; want %d measured", r.Name, r.Ops, r.P50us, r.P99us, p.LatencySamples)
		}
	}
}
