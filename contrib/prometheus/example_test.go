package pgclaimprom_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	pgclaimprom "github.com/pgclaim/pgclaim/contrib/prometheus"
	"github.com/pgclaim/pgclaim/gate"
)

// The service's registry serves pgclaim's series next to its own. The
// elector's hooks export the leader gauge at 0 until this instance leads;
// here two events stand for what gate.NewElector with cfg reports.
func Example() {
	reg := prometheus.NewRegistry()
	m, err := pgclaimprom.New(pgclaimprom.Config{Registerer: reg})
	if err != nil {
		panic(err)
	}
	defer m.Shutdown(context.Background())
	cfg := gate.ElectorConfig{Hooks: m.ElectorHooks("primary")}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	show := func() {
		resp, err := http.Get(srv.URL)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "pgclaim_election_leader{") {
				fmt.Println(line)
			}
		}
	}
	show()
	cfg.Hooks.Observe(context.Background(), gate.Event{Kind: gate.EventAcquired, Name: "primary", Fence: 7})
	show()
	// Output:
	// pgclaim_election_leader{pgclaim_election="primary"} 0
	// pgclaim_election_leader{pgclaim_election="primary"} 1
}
