package pgclaimprom_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	pgclaimotel "github.com/pgclaim/pgclaim/contrib/otel"
	"github.com/pgclaim/pgclaim/contrib/otel/scenario"
	pgclaimprom "github.com/pgclaim/pgclaim/contrib/prometheus"
	"github.com/pgclaim/pgclaim/pgtest"
)

// Two instances, each with its own registry served over HTTP, run claims,
// gate ticks, a schedule with missed instants and a failover; scrapes of
// their endpoints during the run find the documented series with the
// values the run implies. The alert rules name only series the run
// exported.
func TestScrape(t *testing.T) {
	db := pgtest.NewDatabase(t)
	var urls [2]string
	var obs [2]*pgclaimotel.Observer
	for i := range obs {
		reg := prometheus.NewRegistry()
		m, err := pgclaimprom.New(pgclaimprom.Config{Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Shutdown(context.Background()) })
		obs[i] = m.Observer
		srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		t.Cleanup(srv.Close)
		urls[i] = srv.URL + "/metrics"
	}
	exported := map[string]*dto.MetricFamily{} // every family any scrape found
	scenario.Run(t, db, obs, func(t testing.TB, i int, s scenario.Series) (float64, bool) {
		fams := scrape(t, urls[i])
		for name, f := range fams {
			exported[name] = f
		}
		f := fams[s.Prom]
		if f == nil {
			return 0, false
		}
		var sum float64
		found := false
	next:
		for _, m := range f.Metric {
			for k, v := range s.Labels {
				if label(m, strings.ReplaceAll(k, ".", "_")) != v {
					continue next
				}
			}
			found = true
			switch s.Kind {
			case scenario.Counter:
				sum += m.GetCounter().GetValue()
			case scenario.Gauge:
				sum += m.GetGauge().GetValue()
			case scenario.Count:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
		return sum, found
	})
	if t.Failed() {
		return
	}
	checkRules(t, "alerts.yml", exported)
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// scrape GETs url and parses the text exposition format.
func scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// checkRules parses the rules file as Prometheus reads it (groups of
// alerting rules), checks that each rule is complete and that every
// pgclaim series its expression names was exported, and runs
// `promtool check rules` when promtool is installed.
func checkRules(t *testing.T, path string, exported map[string]*dto.MetricFamily) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	alerts := map[string]bool{}
	series := regexp.MustCompile(`pgclaim_[a-z_]+`)
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: rule %+v: want alert, expr, labels.severity and annotations.summary", path, r)
			}
			for _, name := range series.FindAllString(r.Expr, -1) {
				if strings.HasPrefix(name, "pgclaim_") && !isLabel(name) && !has(exported, name) {
					t.Errorf("%s: %s: series %s was not exported by the run", path, r.Alert, name)
				}
			}
		}
	}
	for _, want := range []string{"PgclaimInstantMissed", "PgclaimJobFailing", "PgclaimNoLeader", "PgclaimRowsStuck"} {
		if !alerts[want] {
			t.Errorf("%s: no alert %s", path, want)
		}
	}
	if promtool, err := exec.LookPath("promtool"); err == nil {
		if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
			t.Errorf("promtool check rules %s: %v\n%s", path, err, out)
		}
	} else {
		t.Logf("promtool not installed: %s checked as YAML only", path)
	}
}

// isLabel reports whether name is one of the adapters' label names rather
// than a series.
func isLabel(name string) bool {
	switch name {
	case "pgclaim_schedule", "pgclaim_job", "pgclaim_election", "pgclaim_table", "pgclaim_state",
		"pgclaim_sweep_reason", "pgclaim_schedule_outcome", "pgclaim_gate_outcome":
		return true
	}
	return false
}

func has(fams map[string]*dto.MetricFamily, name string) bool {
	_, ok := fams[name]
	return ok
}
