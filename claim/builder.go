package claim

// Building one statement: its text, and its arguments numbered as their
// placeholders are written.

import (
	"fmt"
	"strconv"
	"strings"
)

// builder builds one statement: arg numbers the placeholders in the order it
// appends their arguments, so that the text and the arguments cannot
// disagree; the text is written with add, in whatever order it reads.
type builder struct {
	text strings.Builder
	args []any
}

// in, as an argument of a builder, stands for the i-th value given to
// query.bind when the statement runs (a key, a token, a new state).
type in int

// The values bound at execution by the statements over claims (see
// core.build): each statement uses those it needs.
const (
	inKey     in = iota // the claim's key; over many claims, their keys ([]K)
	inFence             // the claim's fence; over many claims, their fences ([]int64)
	inValue             // the new state (Finish, FinishBatch) or the lease in microseconds (Extend, heartbeat)
	inReason            // Table.Reason: *string, nil for NULL (finishWith)
	inRetryIn           // microseconds from now to Table.RetryAt (finishWith)
)

// arg appends v as the statement's next argument and returns its
// placeholder.
func (q *builder) arg(v any) string {
	q.args = append(q.args, v)
	return "$" + strconv.Itoa(len(q.args))
}

// add appends text.
func (q *builder) add(text ...string) {
	for _, s := range text {
		q.text.WriteString(s)
	}
}

// done returns the built statement.
func (q *builder) done() query { return query{text: q.text.String(), args: q.args} }

// query is a built statement: its text, and its arguments in placeholder
// order, each a value fixed when it was built or an in.
type query struct {
	text string
	args []any
}

// bind returns the arguments to run q with: q's arguments with each in(i)
// replaced by vals[i].
func (q *query) bind(vals ...any) []any {
	out := make([]any, 0, len(q.args))
	for _, a := range q.args {
		if i, ok := a.(in); ok {
			a = vals[i]
		}
		out = append(out, a)
	}
	return out
}

// countParams returns the highest $N placeholder in a trusted SQL fragment,
// skipping quoted strings and identifiers.
func countParams(where string) (int, error) {
	highest := 0
	for i := 0; i < len(where); i++ {
		switch ch := where[i]; ch {
		case '\'', '"':
			j := strings.IndexByte(where[i+1:], ch)
			if j < 0 {
				return 0, invalid("Config.Where", "unterminated quote")
			}
			i += j + 1
		case '$':
			j := i + 1
			for j < len(where) && where[j] >= '0' && where[j] <= '9' {
				j++
			}
			if j > i+1 {
				n, err := strconv.Atoi(where[i+1 : j])
				if err != nil || n < 1 {
					return 0, invalid("Config.Where", fmt.Sprintf("bad placeholder %q", where[i:j]))
				}
				highest = max(highest, n)
			}
			i = j - 1
		}
	}
	return highest, nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
