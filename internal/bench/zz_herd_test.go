package bench

import (
	"context"
	"os"
	"testing"
	"time"
)

func TestZZHerd(t *testing.T) {
	p := fullParams()
	p.HerdShapes = []herdShape{
		{Instances: 8, Schedules: 500, Period: 10 * time.Second, Instants: 3, Sides: []string{"pgclaim", "river"}},
		{Instances: 8, Schedules: 200, Period: time.Second, Instants: 20, Sides: []string{"pgclaim", "river"}},
	}
	r, err := Run(context.Background(), Config{Scenarios: []string{"herd"}, params: p, Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.WriteMarkdown(os.Stdout)
}
