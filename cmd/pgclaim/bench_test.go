package main

import (
	"encoding/json"
	"testing"

	"github.com/pgclaim/pgclaim/pgtest"
	_ "github.com/pgclaim/pgclaim/pgtest/pgcontainer" // a container where a Docker engine answers
)

func TestBenchUsage(t *testing.T) {
	r := cli(t, "", "bench", "-h")
	wantCode(t, r, exitOK)
	wantContains(t, "help", r.stdout, "--quick", "--scenarios", "--svg", "--markdown", "--database-url", "DATABASE_URL is deliberately not read")

	r = cli(t, "", "bench", "--scenarios", "claims,nope")
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, `unknown scenario "nope"`)

	r = cli(t, "", "bench", "--json", "--markdown")
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, "--json and --markdown")

	r = cli(t, "", "bench", "extra")
	wantCode(t, r, exitUsage)
}

// TestBenchScaleJSON runs one small scenario through the command on the
// test server: progress on stderr, a JSON report on stdout.
func TestBenchScaleJSON(t *testing.T) {
	srv := pgtest.Shared(t)
	r := cli(t, "", "bench", "--quick", "--scenarios", "scale", "--json", "--database-url", srv.URL())
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, "== scale:", "partial index")
	var rep struct {
		Quick     bool `json:"quick"`
		Scenarios []struct {
			Name    string `json:"name"`
			Results []struct {
				TableRows int64   `json:"table_rows"`
				P50us     float64 `json:"p50_us"`
			} `json:"results"`
			Checks []struct {
				OK bool `json:"ok"`
			} `json:"checks"`
		} `json:"scenarios"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
	if !rep.Quick || len(rep.Scenarios) != 1 || rep.Scenarios[0].Name != "scale" {
		t.Fatalf("unexpected report: %+v", rep)
	}
	s := rep.Scenarios[0]
	if len(s.Results) == 0 || len(s.Checks) == 0 {
		t.Fatalf("scale: %d results, %d checks", len(s.Results), len(s.Checks))
	}
	for _, x := range s.Results {
		if x.TableRows == 0 || x.P50us <= 0 {
			t.Errorf("result without figures: %+v", x)
		}
	}
	for _, c := range s.Checks {
		if !c.OK {
			t.Errorf("check failed: %s", r.stdout)
		}
	}
}
