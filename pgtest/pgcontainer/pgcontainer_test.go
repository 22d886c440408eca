package pgcontainer_test

import (
	"context"
	"testing"

	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/pgtest/pgcontainer"
)

// TestSource: with pgcontainer linked, a server comes from a container where
// a Docker engine answers, and from local binaries (or the URL) where none
// does.
func TestSource(t *testing.T) {
	s := pgtest.Shared(t)
	_, remove, err := pgcontainer.Start(context.Background())
	docker := err == nil
	if docker {
		_ = remove()
	}
	switch {
	case s.Source() == pgtest.SourceURL:
	case docker && s.Source() != pgtest.SourceContainer:
		t.Fatalf("a Docker engine answers but the server came from %s", s.Source())
	case !docker && s.Source() != pgtest.SourceLocal:
		t.Fatalf("no Docker engine (%v) but the server came from %s", err, s.Source())
	}
}
