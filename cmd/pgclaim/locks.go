package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pgclaim/pgclaim/status/inspect"
)

const locksAbout = `
Shows what is locked in the database:

  - lease locks (pgclaim_locks): holder, fencing token, since when, until when,
    and whether the lease has expired (by the database's clock);
  - advisory locks held or waited for in this database, with the backend pid,
    application name and client address of the session, and the name of the
    job, lease, election or schedule the lock guards when it can be resolved
    (names are resolved from the tick ledger, the lease table, the election
    terms and the stored schedules; add others with --name); a granted lock's
    holder and start come from the running tick, open term or running run it
    guards, when there is one;
  - open election terms (pgclaim_terms): the current leader of each election.

An advisory lock is released by the server when its session ends; to free one
held by a hung process, end that session (SELECT pg_terminate_backend(PID)).`

// The JSON shapes of 'pgclaim locks' are package inspect's.
type (
	advisoryJSON = inspect.Advisory
	locksJSON    = inspect.Locks
)

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func runLocks(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "locks", "locks [--name NAME]... [--database-url URL] [--json]", locksAbout)
	var names stringList
	f.Var(&names, "name", "also resolve the advisory locks of the job, election or schedule called `NAME` (repeatable)")
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
	if err := requireSchema(ctx, pool, "pgclaim_locks", "pgclaim_ticks", "pgclaim_terms", "pgclaim_schedules", "pgclaim_schedule_runs"); err != nil {
		return err
	}

	out, err := inspect.ReadAllLocks(ctx, pool, f.schema, names)
	if err != nil {
		var ie *inspect.Error
		if errors.As(err, &ie) {
			return dbFail(ie.What, ie.Err)
		}
		return err
	}

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
