package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim"
	"github.com/pgclaim/pgclaim/gate"
)

const locksAbout = `
Shows what is locked in the database:

  - lease locks (pgclaim_locks): holder, fencing token, since when, until when,
    and whether the lease has expired (by the database's clock);
  - advisory locks held or waited for in this database, with the backend pid,
    application name and client address of the session, and the name of the
    job, lease or election the lock guards when it can be resolved (names are
    resolved from the tick ledger, the lease table and the election terms; add
    others with --name); a granted lock's holder and start come from the
    running tick or open term it guards, when there is one;
  - open election terms (pgclaim_terms): the current leader of each election.

An advisory lock is released by the server when its session ends; to free one
held by a hung process, end that session (SELECT pg_terminate_backend(PID)).`

type leaseJSON struct {
	Name             string    `json:"name"`
	Holder           string    `json:"holder"`
	Fence            int64     `json:"fence"`
	LockedAt         time.Time `json:"locked_at"`
	LockUntil        time.Time `json:"lock_until"`
	Expired          bool      `json:"expired"`
	RemainingSeconds float64   `json:"remaining_seconds"`
}

type advisoryJSON struct {
	// Name and Kind are empty when the key could not be resolved.
	Name  string `json:"name"`
	Kind  string `json:"kind"`  // job, lease, election, given, migrations
	Owner string `json:"owner"` // pgclaim, or other for locks pgclaim does not take
	// Class and Key are set for two-int4 locks, BigintKey for bigint ones.
	Class           *int32     `json:"class,omitempty"`
	Key             *int32     `json:"key,omitempty"`
	BigintKey       *int64     `json:"bigint_key,omitempty"`
	Granted         bool       `json:"granted"`
	Mode            string     `json:"mode"`
	PID             *int32     `json:"pid"`
	ApplicationName *string    `json:"application_name"`
	ClientAddr      *string    `json:"client_addr"`
	BackendStart    *time.Time `json:"backend_start"`
	WaitStart       *time.Time `json:"wait_start"`
	Holder          *string    `json:"holder"`
	HeldSince       *time.Time `json:"held_since"`
}

type termJSON struct {
	Election   string     `json:"election"`
	Fence      int64      `json:"fence"`
	Holder     string     `json:"holder"`
	Method     string     `json:"method"`
	StartedAt  time.Time  `json:"started_at"`
	LeaseUntil *time.Time `json:"lease_until"`
	Expired    bool       `json:"expired"`
}

type locksJSON struct {
	Leases    []leaseJSON    `json:"leases"`
	Advisory  []advisoryJSON `json:"advisory"`
	Elections []termJSON     `json:"elections"`
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// knownName is a name whose advisory key may be held.
type knownName struct {
	name, kind string
	holder     *string
	since      *time.Time
}

func runLocks(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "locks", "locks [--name NAME]... [--database-url URL] [--json]", locksAbout)
	var names stringList
	f.Var(&names, "name", "also resolve the advisory locks of the job or election called `NAME` (repeatable)")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	pool, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := requireSchema(ctx, pool, "pgclaim_locks", "pgclaim_ticks", "pgclaim_terms"); err != nil {
		return err
	}

	out := locksJSON{Leases: []leaseJSON{}, Advisory: []advisoryJSON{}, Elections: []termJSON{}}

	// Lease rows.
	rows, err := pool.Query(ctx, `
SELECT name, holder, fence, locked_at, lock_until, lock_until <= now(),
       extract(epoch FROM lock_until - now())::float8
FROM pgclaim_locks ORDER BY name`)
	if err != nil {
		return dbFail("reading pgclaim_locks", err)
	}
	for rows.Next() {
		var l leaseJSON
		if err := rows.Scan(&l.Name, &l.Holder, &l.Fence, &l.LockedAt, &l.LockUntil, &l.Expired, &l.RemainingSeconds); err != nil {
			rows.Close()
			return dbFail("reading pgclaim_locks", err)
		}
		out.Leases = append(out.Leases, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return dbFail("reading pgclaim_locks", err)
	}

	// Open election terms.
	rows, err = pool.Query(ctx, `
SELECT election, term, holder, method, started_at, lease_until, coalesce(lease_until <= now(), false)
FROM pgclaim_terms WHERE ended_at IS NULL ORDER BY election`)
	if err != nil {
		return dbFail("reading pgclaim_terms", err)
	}
	for rows.Next() {
		var t termJSON
		if err := rows.Scan(&t.Election, &t.Fence, &t.Holder, &t.Method, &t.StartedAt, &t.LeaseUntil, &t.Expired); err != nil {
			rows.Close()
			return dbFail("reading pgclaim_terms", err)
		}
		out.Elections = append(out.Elections, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return dbFail("reading pgclaim_terms", err)
	}

	// Names whose advisory keys may be held: jobs in the ledger (with the
	// running tick's holder and start), elections, leases, and --name.
	// Jobs and leases lock gate.AdvisoryKey(name), elections
	// gate.ElectionKey(name); a --name may be either.
	known := map[[2]int32][]knownName{}
	seen := map[string]bool{}
	add := func(k knownName) {
		var keys [][2]int32
		if k.kind != "election" {
			c, key := gate.AdvisoryKey(k.name)
			keys = append(keys, [2]int32{c, key})
		}
		if k.kind == "election" || k.kind == "given" {
			c, key := gate.ElectionKey(k.name)
			keys = append(keys, [2]int32{c, key})
		}
		for _, key := range keys {
			id := fmt.Sprint(key, k.name)
			if seen[id] {
				continue
			}
			seen[id] = true
			known[key] = append(known[key], k)
		}
	}
	for _, t := range out.Elections {
		k := knownName{name: t.Election, kind: "election"}
		if t.Method == "advisory" {
			k.holder, k.since = &t.Holder, &t.StartedAt
		}
		add(k)
	}
	rows, err = pool.Query(ctx, `
SELECT j.job, r.holder, r.started_at
FROM (SELECT DISTINCT job FROM pgclaim_ticks) j
LEFT JOIN LATERAL (
    SELECT holder, started_at FROM pgclaim_ticks t
    WHERE t.job = j.job AND t.outcome = 'running'
    ORDER BY started_at DESC LIMIT 1
) r ON true`)
	if err != nil {
		return dbFail("reading pgclaim_ticks", err)
	}
	for rows.Next() {
		var k knownName
		if err := rows.Scan(&k.name, &k.holder, &k.since); err != nil {
			rows.Close()
			return dbFail("reading pgclaim_ticks", err)
		}
		k.kind = "job"
		add(k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return dbFail("reading pgclaim_ticks", err)
	}
	for _, l := range out.Leases {
		add(knownName{name: l.Name, kind: "lease"})
	}
	for _, n := range names {
		add(knownName{name: n, kind: "given"})
	}

	// Advisory locks in this database, held or awaited. waitstart exists
	// from PostgreSQL 14 on; reading it through jsonb keeps older servers
	// working.
	rows, err = pool.Query(ctx, `
SELECT l.classid::int8, l.objid::int8, l.objsubid::int4, l.pid, l.granted, l.mode,
       (to_jsonb(l) ->> 'waitstart')::timestamptz,
       a.application_name, coalesce(host(a.client_addr), CASE WHEN a.pid IS NOT NULL THEN 'local' END),
       a.backend_start
FROM pg_catalog.pg_locks l
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory'
  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
ORDER BY l.classid, l.objid, l.objsubid, l.granted DESC, l.pid`)
	if err != nil {
		return dbFail("reading pg_locks", err)
	}
	for rows.Next() {
		var classid, objid int64
		var subid int32
		var a advisoryJSON
		if err := rows.Scan(&classid, &objid, &subid, &a.PID, &a.Granted, &a.Mode, &a.WaitStart,
			&a.ApplicationName, &a.ClientAddr, &a.BackendStart); err != nil {
			rows.Close()
			return dbFail("reading pg_locks", err)
		}
		a.Owner = "other"
		switch subid {
		case 2: // pg_advisory_lock(int4, int4)
			class, key := int32(uint32(classid)), int32(uint32(objid))
			a.Class, a.Key = &class, &key
			if class == gate.AdvisoryClass || class == gate.ElectionClass {
				a.Owner = "pgclaim"
				ks := known[[2]int32{class, key}]
				var ns, kinds []string
				for _, k := range ks {
					ns = append(ns, k.name)
					kinds = append(kinds, k.kind)
				}
				a.Name, a.Kind = strings.Join(ns, "|"), strings.Join(kinds, "|")
				if len(ks) == 1 && a.Granted {
					a.Holder, a.HeldSince = ks[0].holder, ks[0].since
				}
			}
		default: // pg_advisory_lock(int8)
			k := classid<<32 | objid
			a.BigintKey = &k
			if k == pgclaim.MigrationLockID {
				a.Owner, a.Name, a.Kind = "pgclaim", "pgclaim migrations", "migrations"
			}
		}
		out.Advisory = append(out.Advisory, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return dbFail("reading pg_locks", err)
	}
	sort.SliceStable(out.Advisory, func(i, j int) bool {
		a, b := out.Advisory[i], out.Advisory[j]
		if ra, rb := advisoryRank(a), advisoryRank(b); ra != rb {
			return ra < rb
		}
		return a.Name < b.Name
	})

	if f.json {
		return writeJSON(e.stdout, out)
	}
	return printLocks(e, out)
}

func printLocks(e *env, out locksJSON) error {
	w := e.stdout
	fmt.Fprintln(w, "LEASE LOCKS (pgclaim_locks)")
	if len(out.Leases) == 0 {
		fmt.Fprintln(w, "  none")
	} else {
		t := newTable(w, "NAME", "HOLDER", "FENCE", "LOCKED AT", "LOCK UNTIL", "STATE")
		for _, l := range out.Leases {
			remaining := time.Duration(l.RemainingSeconds * float64(time.Second))
			state := "held, " + fmtDur(remaining) + " left"
			if l.Expired {
				state = "expired " + fmtDur(-remaining) + " ago"
			}
			t.row(l.Name, l.Holder, l.Fence, fmtTime(l.LockedAt), fmtTime(l.LockUntil), state)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nADVISORY LOCKS")
	if len(out.Advisory) == 0 {
		fmt.Fprintln(w, "  none")
	} else {
		t := newTable(w, "NAME", "KEY", "STATE", "PID", "APPLICATION", "CLIENT", "HOLDER", "SINCE")
		for _, a := range out.Advisory {
			name := a.Name
			switch {
			case name != "" && a.Kind != "":
				name += " (" + a.Kind + ")"
			case a.Owner == "pgclaim":
				name = "? (pgclaim; unknown name, try --name)"
			default:
				name = "- (not pgclaim's)"
			}
			key := "-"
			if a.Class != nil {
				key = fmt.Sprintf("%d/%d", *a.Class, *a.Key)
			} else if a.BigintKey != nil {
				key = fmt.Sprint(*a.BigintKey)
			}
			state := "held"
			if !a.Granted {
				state = "waiting"
			}
			since := "-"
			switch {
			case !a.Granted && a.WaitStart != nil:
				since = fmtTime(*a.WaitStart)
			case a.HeldSince != nil:
				since = fmtTime(*a.HeldSince)
			case a.BackendStart != nil:
				since = "session " + fmtTime(*a.BackendStart)
			}
			t.row(name, key, state, strOrDash(intPtrString(a.PID)), strOrDash(a.ApplicationName),
				strOrDash(a.ClientAddr), strOrDash(a.Holder), since)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}

	fmt.Fprintln(w, "\nELECTIONS (open terms in pgclaim_terms)")
	if len(out.Elections) == 0 {
		fmt.Fprintln(w, "  none")
		return nil
	}
	t := newTable(w, "ELECTION", "FENCE", "HOLDER", "METHOD", "SINCE", "LEASE UNTIL")
	for _, el := range out.Elections {
		until := fmtTimePtr(el.LeaseUntil)
		if el.Expired {
			until += " (expired)"
		}
		t.row(el.Election, el.Fence, el.Holder, el.Method, fmtTime(el.StartedAt), until)
	}
	return t.flush()
}

// advisoryRank orders pgclaim's named locks first, then its unresolved ones,
// then locks pgclaim does not take.
func advisoryRank(a advisoryJSON) int {
	switch {
	case a.Owner == "pgclaim" && a.Name != "":
		return 0
	case a.Owner == "pgclaim":
		return 1
	}
	return 2
}

func strOrDash(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return *s
}

func intPtrString(p *int32) *string {
	if p == nil {
		return nil
	}
	s := fmt.Sprint(*p)
	return &s
}
