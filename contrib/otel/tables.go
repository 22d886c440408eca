package pgclaimotel

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgclaim/pgclaim/claim"
)

// DefaultTablesInterval is TablesConfig.Interval when none is set.
const DefaultTablesInterval = time.Minute

// Querier runs the tables' query: *pgxpool.Pool, *pgx.Conn and pgx.Tx all
// satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Table is a claimed table WatchTables counts.
type Table struct {
	// Table names the table and its State and ClaimedAt columns (the
	// other columns are not used): the claim.Table given to claim.New.
	Table claim.Table
	// InProgress is the state claimed rows are in while worked on
	// (claim.Config.To). When set, the age of the oldest row in that
	// state (by its ClaimedAt, in database time) is reported as
	// pgclaim.claim.table.oldest_claim.age.
	InProgress string
}

// TablesConfig configures WatchTables.
type TablesConfig struct {
	// Tables are the tables to count. Required.
	Tables []Table
	// Interval is how often each table is counted. Default:
	// DefaultTablesInterval. Each count is one statement per table that
	// reads every row (GROUP BY the state column), bounded by Interval.
	Interval time.Duration
	// Logger receives a warning when a count fails. Default (nil):
	// slog.Default().
	Logger *slog.Logger
}

// tableQuery is a validated Table with its statement.
type tableQuery struct {
	name       string // as given, the pgclaim.table attribute
	sql        string
	inProgress string
}

// tableCount is one state's count of one table.
type tableCount struct {
	rows int64
	age  float64 // seconds; < 0: not reported
}

// WatchTables reports, until ctx ends, the rows per state of each of
// cfg.Tables (the observable gauge pgclaim.claim.table.rows) and the age of
// their oldest row in progress (pgclaim.claim.table.oldest_claim.age),
// counting them on db at once and then every cfg.Interval. The gauges
// report the latest count; a state seen once and then emptied reads 0; a
// table whose count failed reports nothing until its next count succeeds
// (and the failure is logged), so that an alert never reads a stale count.
// WatchTables returns an error wrapping claim.ErrInvalid for a bad cfg,
// else nil once ctx ends. Nothing is counted unless it is called; call it
// once per Observer (in a goroutine of its own), with every table.
func (o *Observer) WatchTables(ctx context.Context, db Querier, cfg TablesConfig) error {
	qs, err := cfg.check()
	if err != nil {
		return err
	}
	if db == nil {
		return fmt.Errorf("pgclaimotel: WatchTables: db: must not be nil: %w", claim.ErrInvalid)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	var mu sync.Mutex
	counts := make([]map[string]tableCount, len(qs))
	rows, err := o.meter.Int64ObservableGauge("pgclaim.claim.table.rows", metric.WithUnit("{row}"),
		metric.WithDescription("Rows of a claimed table per state, as of the latest count."))
	if err != nil {
		return err
	}
	age, err := o.meter.Float64ObservableGauge("pgclaim.claim.table.oldest_claim.age", metric.WithUnit("s"),
		metric.WithDescription("Age by database time of the oldest claim of a table's rows in progress, as of the latest count."))
	if err != nil {
		return err
	}
	reg, err := o.meter.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		mu.Lock()
		defer mu.Unlock()
		for i, q := range qs {
			for state, c := range counts[i] {
				attrs := metric.WithAttributes(keyTable.String(q.name), keyState.String(state))
				obs.ObserveInt64(rows, c.rows, attrs)
				if c.age >= 0 {
					obs.ObserveFloat64(age, c.age, attrs)
				}
			}
		}
		return nil
	}, rows, age)
	if err != nil {
		return err
	}
	defer func() { _ = reg.Unregister() }()

	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for {
		for i, q := range qs {
			got, err := q.count(ctx, db, cfg.Interval)
			if err != nil && ctx.Err() == nil {
				log.WarnContext(ctx, "pgclaimotel: count table rows", "table", q.name, "error", err)
			}
			mu.Lock()
			switch {
			case err != nil:
				counts[i] = nil
			case counts[i] == nil:
				counts[i] = got
			default:
				for state := range counts[i] {
					if _, ok := got[state]; !ok {
						got[state] = tableCount{age: -1}
					}
				}
				counts[i] = got
			}
			mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// check validates cfg, fills its defaults and builds the statements.
func (cfg *TablesConfig) check() ([]tableQuery, error) {
	bad := func(field, msg string) error {
		return fmt.Errorf("pgclaimotel: TablesConfig.%s: %s: %w", field, msg, claim.ErrInvalid)
	}
	switch {
	case len(cfg.Tables) == 0:
		return nil, bad("Tables", "must not be empty")
	case cfg.Interval < 0:
		return nil, bad("Interval", "must not be negative")
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultTablesInterval
	}
	qs := make([]tableQuery, 0, len(cfg.Tables))
	for i, t := range cfg.Tables {
		field := fmt.Sprintf("Tables[%d].Table.", i)
		switch {
		case t.Table.Name == "" || strings.Count(t.Table.Name, ".") > 1:
			return nil, bad(field+"Name", fmt.Sprintf("%q is not a table name (\"table\" or \"schema.table\")", t.Table.Name))
		case t.Table.State == "":
			return nil, bad(field+"State", "must not be empty")
		case t.Table.ClaimedAt == "":
			return nil, bad(field+"ClaimedAt", "must not be empty")
		}
		tbl := pgx.Identifier(strings.Split(t.Table.Name, ".")).Sanitize()
		state := pgx.Identifier{t.Table.State}.Sanitize()
		claimedAt := pgx.Identifier{t.Table.ClaimedAt}.Sanitize()
		qs = append(qs, tableQuery{
			name:       t.Table.Name,
			inProgress: t.InProgress,
			sql: "SELECT " + state + "::text, count(*), EXTRACT(epoch FROM now() - min(" + claimedAt + "))::float8 FROM " +
				tbl + " GROUP BY " + state,
		})
	}
	return qs, nil
}

// count runs q's statement, bounded by timeout.
func (q tableQuery) count(ctx context.Context, db Querier, timeout time.Duration) (map[string]tableCount, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rows, err := db.Query(ctx, q.sql)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]tableCount{}
	for rows.Next() {
		var state *string
		var n int64
		var age *float64
		if err := rows.Scan(&state, &n, &age); err != nil {
			return nil, err
		}
		if state == nil {
			continue // rows with no state are in none
		}
		c := tableCount{rows: n, age: -1}
		if *state == q.inProgress && age != nil {
			c.age = *age
		}
		out[*state] = c
	}
	return out, rows.Err()
}
