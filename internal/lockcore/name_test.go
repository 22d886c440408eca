package lockcore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/internal/lockcore"
	"github.com/pgclaim/pgclaim/pgtest"
)

// TestSessionName: pg_stat_activity names the lock session "pgclaim locks
// hostname:pid", unless the pool's configuration names its sessions.
func TestSessionName(t *testing.T) {
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	named, err := pgxpool.New(ctx, db.URL+sep(db.URL)+"application_name=svc-a")
	if err != nil {
		t.Fatal(err)
	}
	defer named.Close()
	for _, c := range []struct {
		pool *pgxpool.Pool
		want string
	}{{db.Pool, lockcore.SessionName}, {named, "svc-a"}} {
		ss := lockcore.Share(c.pool, nil)
		s, err := ss.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var name string
		if err := s.Conn.QueryRow(ctx, `SELECT current_setting('application_name')`).Scan(&name); err != nil {
			t.Fatal(err)
		}
		ss.Put(s)
		ss.Close()
		if name != c.want {
			t.Errorf("lock session named %q, want %q", name, c.want)
		}
	}
}

// sep is what joins a parameter to url.
func sep(url string) string {
	if strings.Contains(url, "?") {
		return "&"
	}
	return "?"
}
