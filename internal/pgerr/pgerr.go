package pgerr

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// InsufficientPrivilege is the SQLSTATE of a refused privilege.
const InsufficientPrivilege = "42501"

// GrantsHint tells an operator where every statement pgclaim needs is.
const GrantsHint = "'pgclaim grants --role ROLE' prints every grant pgclaim's tables need"

// PrivilegeError is a statement the server refused for want of a
// privilege. It is permanent: the same statement fails until someone grants
// the privilege.
type PrivilegeError struct {
	// Privilege is what the role lacks, e.g. "SELECT, INSERT, UPDATE,
	// DELETE on table pgclaim_ticks"; empty when the server's message did
	// not say on what.
	Privilege string
	// Grant is the statement that grants it (run by the object's owner),
	// with <role> for the role that was refused; or what else to do.
	Grant string
	// Err is the server's error.
	Err *pgconn.PgError
}

func (e *PrivilegeError) Error() string {
	if e.Privilege == "" {
		return fmt.Sprintf("%s (SQLSTATE %s): %s", e.Err.Message, e.Err.Code, e.Grant)
	}
	return fmt.Sprintf("%s (SQLSTATE %s): the role lacks %s; %s", e.Err.Message, e.Err.Code, e.Privilege, e.Grant)
}

func (e *PrivilegeError) Unwrap() error { return e.Err }

// Permanent reports whether err is a refused privilege (SQLSTATE 42501),
// which no retry cures.
func Permanent(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == InsufficientPrivilege
}

// Explain returns err with a missing privilege explained: when err is (or
// wraps) a refused privilege, an error reading "<context>: <server's
// message>: the role lacks <privilege>; grant it with: <statement>" that
// unwraps to err; otherwise err itself. It is idempotent.
func Explain(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != InsufficientPrivilege {
		return err
	}
	var done *PrivilegeError
	if errors.As(err, &done) {
		return err
	}
	return &explained{err: err, p: Privilege(pe)}
}

// explained is err, with the explanation appended to its text.
type explained struct {
	err error
	p   *PrivilegeError
}

func (e *explained) Error() string {
	msg := e.err.Error()
	if e.p.Privilege != "" {
		msg += ": the role lacks " + e.p.Privilege
	}
	return msg + "; " + e.p.Grant
}

func (e *explained) Unwrap() []error { return []error{e.err, e.p} }

// deniedRE matches the server's (English) message for a refused object.
var deniedRE = regexp.MustCompile(`^permission denied for (table|sequence|function|schema|view|relation|database|procedure) (.+)$`)

// walFunctions are the functions the timeline fence reads.
var walFunctions = map[string]bool{"pg_walfile_name": true, "pg_current_wal_insert_lsn": true}

// Privilege explains pe, a refused privilege (SQLSTATE 42501).
func Privilege(pe *pgconn.PgError) *PrivilegeError {
	p := &PrivilegeError{Err: pe}
	m := deniedRE.FindStringSubmatch(pe.Message)
	if m == nil {
		p.Grant = "grant the privilege the statement needs to the role; " + GrantsHint
		return p
	}
	kind, name := m[1], m[2]
	switch kind {
	case "table", "view", "relation":
		priv := "SELECT, INSERT, UPDATE, DELETE"
		switch {
		case name == "pgclaim_fence_mode" || name == "pgclaim_schema_version":
			priv = "SELECT"
		case !strings.HasPrefix(name, "pgclaim_"):
			priv = "SELECT, UPDATE" // a claimed table of the application's
		}
		p.Privilege = priv + " on table " + name
		p.Grant = fmt.Sprintf("grant it with: GRANT %s ON TABLE %s TO <role>; %s", priv, name, GrantsHint)
	case "sequence":
		p.Privilege = "USAGE on sequence " + name
		p.Grant = fmt.Sprintf("grant it with: GRANT USAGE, SELECT ON SEQUENCE %s TO <role>; %s", name, GrantsHint)
	case "function", "procedure":
		if walFunctions[name] {
			p.Privilege = "EXECUTE on function " + name + ", which the timeline fence reads"
			p.Grant = "run 'pgclaim migrate up' (or pgclaim.Migrate) so that pgclaim_fence() switches to the sequence fence, " +
				"or grant it with: GRANT EXECUTE ON FUNCTION pg_current_wal_insert_lsn(), pg_walfile_name(pg_lsn) TO PUBLIC"
			return p
		}
		sig := name + "(...)"
		switch name {
		case "pgclaim_fence", "pgclaim_fence_check":
			sig = name + "()"
		case "pgclaim_raise":
			sig = name + "(text, text)"
		}
		p.Privilege = "EXECUTE on function " + name
		p.Grant = fmt.Sprintf("grant it with: GRANT EXECUTE ON FUNCTION %s TO <role>; %s", sig, GrantsHint)
	case "schema":
		p.Privilege = "USAGE on schema " + name
		p.Grant = fmt.Sprintf("grant it with: GRANT USAGE ON SCHEMA %s TO <role>; %s", name, GrantsHint)
	case "database":
		p.Privilege = "CONNECT on database " + name
		p.Grant = fmt.Sprintf("grant it with: GRANT CONNECT ON DATABASE %s TO <role>", name)
	}
	return p
}

// ReadOnlyServer says what a statement refused with SQLSTATE 25006 means.
const ReadOnlyServer = "this connection reaches a read-only server (a standby, or the writer's address pointing at a reader after a failover): write through the primary"

// ReadOnly reports whether err is a statement refused because the server
// is read-only (SQLSTATE 25006): a hot standby, or a writer's address that
// points at a reader after a failover. It passes when the connection
// reaches the writer: drop the connections and reconnect.
func ReadOnly(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "25006"
}

// Refused reports whether err is the server refusing a connection for want
// of room or readiness: too many connections (SQLSTATE 53300, including a
// role's or a database's connection limit), the server starting up or
// shutting down (57P03), or out of memory for a backend (53200). Such a
// failure passes when connections free up: back off, do not retry at once.
func Refused(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "53300", "57P03", "53200":
			return true
		}
	}
	return false
}
