package roletest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgclaim/pgclaim/pgtest"
)

// RevokeWAL is what a test runs in a database to emulate a server that
// refuses the WAL control functions pgclaim's timeline fence reads.
// Function privileges are per database: it changes only the database it
// runs in.
const RevokeWAL = `REVOKE EXECUTE ON FUNCTION pg_current_wal_insert_lsn() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pg_walfile_name(pg_lsn) FROM PUBLIC`

// GrantWAL undoes RevokeWAL.
const GrantWAL = `GRANT EXECUTE ON FUNCTION pg_current_wal_insert_lsn() TO PUBLIC;
GRANT EXECUTE ON FUNCTION pg_walfile_name(pg_lsn) TO PUBLIC`

// Role is a login role made for one test.
type Role struct {
	Name     string
	Password string
	URL      string        // the database's URL, connecting as the role
	Pool     *pgxpool.Pool // a pool on the database, as the role
	db       *pgtest.Database
}

// New creates a login role (not a superuser, no CREATEDB, no CREATEROLE)
// named pgtest_role_<random> and runs grants in db as the database's owner,
// each with every "ROLE" word replaced by the role's quoted name. The role
// and everything granted to it are dropped when t ends.
func New(t testing.TB, db *pgtest.Database, grants ...string) *Role {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b [6]byte
	_, _ = rand.Read(b[:])
	r := &Role{Name: "pgtest_role_" + hex.EncodeToString(b[:]), db: db}
	_, _ = rand.Read(b[:])
	r.Password = "pw" + hex.EncodeToString(b[:])
	admin, err := db.Server.Admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	q := r.Ident()
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '%s'", q, r.Password)); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" && os.Getenv("CI") != "true" {
			t.Skipf("roletest: the test server's role may not create roles (it needs CREATEROLE): %v", err)
		}
		t.Fatalf("roletest: create role: %v", err)
	}
	t.Cleanup(func() { r.drop(t) })
	if err := r.Grant(ctx, grants...); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = r.Name
	cfg.ConnConfig.Password = r.Password
	cfg.ConnConfig.RuntimeParams["application_name"] = "roletest"
	if r.Pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	r.URL = urlAs(db.URL, r.Name, r.Password)
	return r
}

// Ident is the role's name, quoted for SQL.
func (r *Role) Ident() string { return pgx.Identifier{r.Name}.Sanitize() }

// Grant runs statements in the role's database as its owner, each with
// every "ROLE" word replaced by the role's quoted name.
func (r *Role) Grant(ctx context.Context, stmts ...string) error {
	for _, s := range stmts {
		s = replaceRole(s, r.Ident())
		if _, err := r.db.Pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("roletest: %s: %w", s, err)
		}
	}
	return nil
}

// replaceRole replaces the whole word ROLE in s by ident.
func replaceRole(s, ident string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "ROLE")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		end := i + len("ROLE")
		word := (i == 0 || !isWord(s[i-1])) && (end == len(s) || !isWord(s[end]))
		b.WriteString(s[:i])
		if word {
			b.WriteString(ident)
		} else {
			b.WriteString("ROLE")
		}
		s = s[end:]
	}
}

func isWord(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// urlAs returns u (a URL or keyword/value string) connecting as user.
func urlAs(u, user, password string) string {
	if pu, err := url.Parse(u); err == nil && pu.Scheme != "" {
		pu.User = url.UserPassword(user, password)
		return pu.String()
	}
	return u + " user=" + user + " password=" + password
}

func (r *Role) drop(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if r.Pool != nil {
		r.Pool.Close()
	}
	admin, err := r.db.Server.Admin(ctx)
	if err != nil {
		t.Error(err)
		return
	}
	// Privileges in the test's database go with DROP OWNED there (the
	// database may already be dropped).
	_, _ = r.db.Pool.Exec(ctx, "DROP OWNED BY "+r.Ident())
	if _, err := admin.Exec(ctx, "DROP ROLE IF EXISTS "+r.Ident()); err != nil {
		t.Errorf("roletest: drop role: %v", err)
	}
}
