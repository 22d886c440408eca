package qualify

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// nameRE is a schema name pgclaim accepts: a lower-case SQL identifier,
// the same unquoted and quoted (goose writes its version table's name
// unquoted).
var nameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Check returns why name cannot be pgclaim's schema, or "" when it can.
// The empty name means "no schema of its own" and is accepted.
func Check(name string) string {
	switch {
	case name == "":
		return ""
	case !nameRE.MatchString(name):
		return fmt.Sprintf("%q is not a lower-case SQL identifier (letters, digits, '_'; at most 63 bytes; not starting with a digit)", name)
	case strings.HasPrefix(name, "pg_") || name == "information_schema":
		return fmt.Sprintf("%q is reserved by PostgreSQL", name)
	}
	return ""
}

// DBTX is what pgclaim's statements run on (store.DBTX, claim.DBTX).
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Schema rewrites statements for one schema; the zero value and nil leave
// them as they are. Rewritten texts are cached: pgclaim's statements are a
// fixed set, rewritten once each.
type Schema struct {
	name  string
	quote string
	cache sync.Map // statement → rewritten statement
}

// New returns the rewriter for schema name (nil for ""). The name must
// have passed Check.
func New(name string) *Schema {
	if name == "" {
		return nil
	}
	return &Schema{name: name, quote: pgx.Identifier{name}.Sanitize()}
}

// Name returns the schema's name ("" for nil).
func (s *Schema) Name() string {
	if s == nil {
		return ""
	}
	return s.name
}

// Object returns object (a pgclaim_… name, optionally with an argument
// list) qualified with the schema, for text passed as a value, such as
// to_regclass's argument.
func (s *Schema) Object(object string) string {
	if s == nil {
		return object
	}
	return s.quote + "." + object
}

// SQL returns stmt with every pgclaim_… identifier qualified.
func (s *Schema) SQL(stmt string) string {
	if s == nil {
		return stmt
	}
	if v, ok := s.cache.Load(stmt); ok {
		return v.(string)
	}
	out := Rewrite(stmt, s.quote)
	s.cache.Store(stmt, out)
	return out
}

// Wrap returns db with every statement's text rewritten (db itself for a
// nil Schema).
func (s *Schema) Wrap(db DBTX) DBTX {
	if s == nil {
		return db
	}
	return wrapped{db, s}
}

type wrapped struct {
	db DBTX
	s  *Schema
}

func (w wrapped) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return w.db.Exec(ctx, w.s.SQL(sql), args...)
}

func (w wrapped) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return w.db.Query(ctx, w.s.SQL(sql), args...)
}

func (w wrapped) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return w.db.QueryRow(ctx, w.s.SQL(sql), args...)
}

// Rewrite qualifies with quoted (an already quoted schema name) every
// identifier of stmt that starts with "pgclaim_" and is not already
// qualified, outside string literals (plain, E'…' and dollar-quoted),
// quoted identifiers and comments.
func Rewrite(stmt, quoted string) string {
	var b strings.Builder
	b.Grow(len(stmt) + 64)
	i, n := 0, len(stmt)
	prev := byte(0) // the last byte outside space, comments and literals
	for i < n {
		c := stmt[i]
		switch {
		case c == '-' && i+1 < n && stmt[i+1] == '-':
			j := strings.IndexByte(stmt[i:], '\n')
			if j < 0 {
				j = n - i
			}
			b.WriteString(stmt[i : i+j])
			i += j
			continue
		case c == '/' && i+1 < n && stmt[i+1] == '*':
			j, depth := i+2, 1
			for j < n && depth > 0 {
				switch {
				case stmt[j] == '/' && j+1 < n && stmt[j+1] == '*':
					depth++
					j += 2
				case stmt[j] == '*' && j+1 < n && stmt[j+1] == '/':
					depth--
					j += 2
				default:
					j++
				}
			}
			b.WriteString(stmt[i:j])
			i = j
			continue
		case c == '\'' || c == '"':
			// E'…' strings take backslash escapes; others double the quote.
			escapes := c == '\'' && i > 0 && (stmt[i-1] == 'E' || stmt[i-1] == 'e') && (i < 2 || !identByte(stmt[i-2]))
			j := closing(stmt, i, escapes)
			b.WriteString(stmt[i:j])
			i, prev = j, c
			continue
		case c == '$':
			if tag, ok := dollarTag(stmt[i:]); ok {
				end := strings.Index(stmt[i+len(tag):], tag)
				j := n
				if end >= 0 {
					j = i + len(tag) + end + len(tag)
				}
				b.WriteString(stmt[i:j])
				i, prev = j, '$'
				continue
			}
		case identStart(c):
			j := i + 1
			for j < n && identByte(stmt[j]) {
				j++
			}
			word := stmt[i:j]
			if prev != '.' && len(word) > len("pgclaim_") && strings.EqualFold(word[:len("pgclaim_")], "pgclaim_") {
				b.WriteString(quoted)
				b.WriteByte('.')
			}
			b.WriteString(word)
			i, prev = j, word[len(word)-1]
			continue
		}
		b.WriteByte(c)
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			prev = c
		}
		i++
	}
	return b.String()
}

// closing returns the index after the literal or quoted identifier that
// opens at stmt[i] (its quote, doubled inside it), or len(stmt).
func closing(stmt string, i int, escapes bool) int {
	q, n := stmt[i], len(stmt)
	for j := i + 1; j < n; j++ {
		switch {
		case escapes && stmt[j] == '\\':
			j++
		case stmt[j] == q && j+1 < n && stmt[j+1] == q:
			j++
		case stmt[j] == q:
			return j + 1
		}
	}
	return n
}

// dollarTag returns the opening $tag$ of a dollar-quoted string at the
// start of s ("$$" or "$name$"); a parameter ($1) is none.
func dollarTag(s string) (string, bool) {
	for j := 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '$':
			return s[:j+1], true
		case j == 1 && !identStart(c):
			return "", false
		case !identByte(c) || c == '$':
			return "", false
		}
	}
	return "", false
}

func identStart(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

func identByte(c byte) bool {
	return identStart(c) || c >= '0' && c <= '9' || c == '$'
}
