package chaos

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgclaim/pgclaim/harness/bouncer"
	"github.com/pgclaim/pgclaim/pgtest"
)

func TestMain(m *testing.M) {
	// The harness starts this test binary again as its instances.
	MaybeWorker()
	// The harness starts (and restarts) a cluster of its own.
	os.Unsetenv(pgtest.EnvURL)
	os.Exit(m.Run())
}

// runHarness runs the harness for a test, skipping when no local
// PostgreSQL (or, for runs that need it, no PgBouncer, or no Patroni and
// etcd) is available, unless CI is "true". It fails the test when an
// instance's log shows a data race.
func runHarness(t *testing.T, cfg Config) *Result {
	t.Helper()
	if testing.Short() {
		t.Skip("the chaos harness takes tens of seconds; skipped with -short")
	}
	if cfg.Patroni {
		if _, err := findPatroni(); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal(err)
			}
			t.Skip(err)
		}
	} else if cfg.Faults == nil && !cfg.NoFaults || containsFault(cfg.Faults, FaultBouncer) {
		if _, err := bouncer.Find(); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal(err)
			}
			t.Skip(err)
		}
	}
	var out bytes.Buffer
	cfg.Out = &out
	// Logs and report stay on disk when the test fails.
	dir, err := os.MkdirTemp("", "chaos-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("instance logs and report kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	cfg.Dir = dir
	// The run, then up to 4 minutes of settling (harness.settle), then the
	// checks.
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+6*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
	if errors.Is(err, pgtest.ErrUnavailable) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var report bytes.Buffer
	res.Print(&report)
	t.Logf("%s%s", out.String(), report.String())
	_ = os.WriteFile(filepath.Join(dir, "report.txt"), append(out.Bytes(), report.Bytes()...), 0o644)
	logs, _ := filepath.Glob(filepath.Join(cfg.Dir, "instance-*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if bytes.Contains(b, []byte("DATA RACE")) || bytes.Contains(b, []byte("panic:")) {
			t.Errorf("%s shows a data race or a panic:\n%s", l, b)
		}
	}
	return res
}

func containsFault(fs []Fault, f Fault) bool {
	for _, x := range fs {
		if x == f {
			return true
		}
	}
	return false
}

// TestHealthyRun runs every fault kind for a short while against the real
// worker: no invariant may break, and the run must have covered something.
func TestHealthyRun(t *testing.T) {
	res := runHarness(t, Config{Duration: 25 * time.Second, FaultEvery: time.Second, Schedules: 10})
	if v := res.Violations(); v != 0 {
		t.Fatalf("%d violations with the real worker (seed %d)", v, res.Seed)
	}
	faults := 0
	for _, f := range res.Faults {
		if f.Kind != FaultBouncer {
			faults += f.Count
		}
	}
	if faults == 0 {
		t.Errorf("no fault was injected: %+v", res.Faults)
	}
	for _, name := range []string{checkRowsOnce, checkSchedWindow, checkSchedEffects, checkSchedExclusive, checkSchedZombies, checkTerms, checkFence, checkPooler} {
		c := res.Check(name)
		if c == nil || c.Checked == 0 {
			t.Errorf("check %q covered nothing: %+v", name, c)
		}
	}
}

// TestCheckerCatchesBrokenWorkers proves the checker can fail: each broken
// worker lacks one guard, and the check that guard protects must report
// violations.
func TestCheckerCatchesBrokenWorkers(t *testing.T) {
	cases := []struct {
		broken string
		cfg    Config
		want   []string // checks of which at least one must report violations
	}{
		{
			// A rescuer without the state guard takes finished rows back:
			// they are worked, and take effect, again (or end FAILED with
			// effects once their attempts run out). No fault needed.
			broken: BrokenNoGuard,
			cfg:    Config{Duration: 8 * time.Second, NoFaults: true},
			want:   []string{checkRowsOnce, checkRowsFailed},
		},
		{
			// Finishing without the token: paused instances wake up as
			// zombies and finish rows that were swept and claimed again.
			broken: BrokenNoFence,
			cfg:    Config{Duration: 15 * time.Second, Faults: []Fault{FaultPause}, FaultEvery: time.Second},
			want:   []string{checkFence, checkRowsOnce},
		},
		{
			// Without the scheduler and its ledger every instance runs
			// every instant, and every tick of the gate.Once job.
			broken: BrokenNoLedger,
			cfg:    Config{Duration: 5 * time.Second, NoFaults: true, Schedules: 5},
			want:   []string{checkSchedEffects, checkSchedExclusive, checkTicksOnce},
		},
		{
			// The job writing without the run's fence, ignoring its
			// context: a runner stopped past its lease writes after its
			// run was taken over (leases), or completes it (advisory).
			broken: BrokenNoSchedFence,
			cfg:    Config{Duration: 15 * time.Second, Faults: []Fault{FaultPause, FaultBouncer}, FaultEvery: time.Second, Schedules: 20},
			want:   []string{checkSchedStopped, checkSchedExclusive},
		},
	}
	for _, tc := range cases {
		t.Run(tc.broken, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Broken = tc.broken
			res := runHarness(t, cfg)
			// A run whose faults never reached what the broken worker
			// breaks (no SIGSTOP landed on a schedule's run) proves
			// nothing either way: run it again, up to three times.
			for try := 1; try < 3 && res.Violations() == 0 && !exercised(res, tc.want); try++ {
				t.Logf("try %d: the faults did not reach the checks %q; running again", try, tc.want)
				res = runHarness(t, cfg)
			}
			if res.Violations() == 0 {
				t.Fatalf("the checker found nothing wrong with the %s worker", tc.broken)
			}
			caught := false
			for _, name := range tc.want {
				if c := res.Check(name); c != nil && c.Violations > 0 {
					caught = true
				}
			}
			if !caught {
				t.Errorf("none of the checks %q reported a violation for the %s worker", tc.want, tc.broken)
			}
			if c := res.Check(checkTicksOnce); tc.broken == BrokenNoLedger && (c == nil || c.Violations == 0) {
				t.Errorf("%q reported nothing for the %s worker, whose every instance runs every tick", checkTicksOnce, tc.broken)
			}
			var report bytes.Buffer
			res.Print(&report)
			if !strings.Contains(report.String(), "--seed ") {
				t.Errorf("report of a failed run does not print the seed to replay:\n%s", report.String())
			}
		})
	}
}

// TestAdvisoryRefusesBehindPgBouncer: the advisory gate and elector detect
// transaction pooling and refuse with gate.ErrPooler; the lease variants
// work through the same PgBouncer.
func TestAdvisoryRefusesBehindPgBouncer(t *testing.T) {
	if _, err := bouncer.Find(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	db := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := bouncer.Start(ctx, db.Server.URL(), db.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	c := probePooler(ctx, b.URL(db.Name, "chaos-probe"))
	if c.Checked != 5 || c.Violations != 0 {
		t.Fatalf("probe behind PgBouncer: %d checked, %d violations: %v", c.Checked, c.Violations, c.Examples)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	cases := []struct {
		cfg  Config
		want string
	}{
		{Config{}, "Config.Duration"},
		{Config{Duration: time.Second, Instances: 1}, "Config.Instances"},
		{Config{Duration: time.Second, Broken: "nothing"}, "Config.Broken"},
		{Config{Duration: time.Second, Period: 10 * time.Millisecond}, "Config.Period"},
		{Config{Duration: time.Second, Window: time.Second}, "Config.Window"},
		{Config{Duration: time.Second, Faults: []Fault{FaultBouncer}, Bouncer: 9}, "Config.Bouncer"},
		{Config{Duration: time.Second, Sync: true}, "Config.Sync"},
		{Config{Duration: time.Second, Faults: []Fault{FaultKill, FaultSwitchover}}, "Config.Faults"},
		{Config{Duration: time.Second, Patroni: true, Faults: []Fault{FaultFailover, FaultRestart}}, "Config.Faults"},
		{Config{Duration: time.Second, Patroni: true, Faults: []Fault{FaultBouncer}}, "Config.Faults"},
	}
	for _, tc := range cases {
		if _, err := tc.cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	if _, err := ParseFaults("kill,meteor"); err == nil || !strings.Contains(err.Error(), `"meteor"`) {
		t.Errorf("ParseFaults: got %v, want an error naming the unknown fault", err)
	}
	fs, err := ParseFaults("pause, kill,pause")
	if err != nil || len(fs) != 2 || fs[0] != FaultPause || fs[1] != FaultKill {
		t.Errorf("ParseFaults: got %v, %v", fs, err)
	}
	if fs, _ := ParseFaults("none"); len(fs) != 0 {
		t.Errorf("ParseFaults(none) = %v", fs)
	}
	if fs, err := ParseFaults("switchover,silent,kill"); err != nil || len(fs) != 3 {
		t.Errorf("ParseFaults(switchover,silent,kill): got %v, %v", fs, err)
	}
	c, err := Config{Duration: time.Second, Patroni: true}.withDefaults()
	if err != nil || !sameFaults(c.Faults, PatroniFaults) || c.Bouncer != 0 {
		t.Errorf("Patroni defaults: faults %v, bouncer %d, %v; want %v, 0", c.Faults, c.Bouncer, err, PatroniFaults)
	}
}

// TestPatroniLines: the acknowledgements the instances write are parsed,
// and the first claim and run after a promotion are attributed to it, not
// the ones before.
func TestPatroniLines(t *testing.T) {
	p := &patroniRun{rows: map[int64]ack{}, runs: map[runKey]ack{}}
	p.line([]byte("D i0#1:42 7:100 8:101"))
	p.line([]byte("R i1#0:43 chaos-s/adv/03 1700000000000000 55"))
	p.line([]byte("D i0#1:42 junk"))
	if got := p.rows[7]; got != (ack{"i0#1:42", 100}) || p.rows[8].fence != 101 || len(p.rows) != 2 {
		t.Errorf("rows: %+v", p.rows)
	}
	if got := p.runs[runKey{"chaos-s/adv/03", 1700000000000000}]; got != (ack{"i1#0:43", 55}) {
		t.Errorf("runs: %+v", p.runs)
	}
	e := &promotion{kind: FaultFailover, at: time.Now()}
	p.events = append(p.events, e)
	p.line([]byte(msgBatchStart)) // before the promotion: not counted
	if !e.firstClaim.IsZero() {
		t.Errorf("a claim before the promotion counted: %v", e.firstClaim)
	}
	e.promoted = time.Now()
	time.Sleep(time.Millisecond)
	p.line([]byte(msgBatchStart))
	first := e.firstClaim
	p.line([]byte(msgBatchStart))
	if first.IsZero() || !e.firstClaim.Equal(first) || !first.After(e.promoted) {
		t.Errorf("first claim %v (now %v), promoted %v", first, e.firstClaim, e.promoted)
	}
	if got := pct([]time.Duration{3 * time.Second, time.Second, 2 * time.Second}); got != "p50 2s, p99 3s (n=3)" {
		t.Errorf("pct: %s", got)
	}
}

// TestPatroniRun is the short Patroni mode: etcd and two nodes under
// Patroni, synchronous_mode on, the cluster faults for a short while.
// Every check must hold, the old primary must never have taken writes
// again, and no acknowledged commit may be lost.
func TestPatroniRun(t *testing.T) {
	res := runHarness(t, Config{Duration: 30 * time.Second, Patroni: true, Sync: true, Schedules: 10, FaultEvery: time.Second})
	if v := res.Violations(); v != 0 {
		t.Fatalf("%d violations with Patroni, synchronous_mode on (seed %d)", v, res.Seed)
	}
	for _, name := range []string{checkPatroniConfig, checkPatroniDual, checkPatroniRejoin, checkPatroniLost, checkRowsOnce, checkSchedEffects, checkTerms} {
		if c := res.Check(name); c == nil || c.Checked == 0 {
			t.Errorf("check %q covered nothing: %+v", name, c)
		}
	}
}

// exercised reports whether every one of the named checks had something
// to check.
func exercised(res *Result, names []string) bool {
	for _, name := range names {
		if c := res.Check(name); c == nil || c.Checked == 0 {
			return false
		}
	}
	return true
}
