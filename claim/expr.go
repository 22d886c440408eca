package claim

// Reading the expressions PostgreSQL deparses (CHECK constraints, index
// predicates) for the states they allow.

import (
	"slices"
	"strings"
)

// allowedStates reads a boolean expression as PostgreSQL deparses it
// (pg_get_expr) and returns the values it allows for column col, with
// ok = false when it cannot tell. It understands comparisons of the column
// (possibly cast) with string literals, "col = 'x'" and
// "col = ANY (ARRAY['x', ...])" (which is how "col IN (...)" is stored),
// joined by OR (the union) and AND (the intersection of the parts it
// understands; the others only narrow it further). Everything else, such
// as NOT, <>, functions or E” literals, is not understood: a value it
// does not list is then not known to be rejected.
func allowedStates(expr, col string) ([]string, bool) {
	e := stripParens(strings.TrimSpace(expr))
	if parts := splitTop(e, " OR "); len(parts) > 1 {
		var all []string
		for _, p := range parts {
			vals, ok := allowedStates(p, col)
			if !ok {
				return nil, false
			}
			for _, v := range vals {
				if !slices.Contains(all, v) {
					all = append(all, v)
				}
			}
		}
		return all, true
	}
	if parts := splitTop(e, " AND "); len(parts) > 1 {
		var set []string
		known := false
		for _, p := range parts {
			vals, ok := allowedStates(p, col)
			if !ok {
				continue
			}
			if !known {
				set, known = vals, true
				continue
			}
			set = slices.DeleteFunc(set, func(v string) bool { return !slices.Contains(vals, v) })
		}
		return set, known
	}
	sides := splitTop(e, " = ")
	if len(sides) != 2 || !isColumn(sides[0], col) {
		return nil, false
	}
	rhs := stripParens(sides[1])
	if arr, ok := strings.CutPrefix(rhs, "ANY "); ok {
		arr = stripCasts(arr)
		inner, ok := strings.CutPrefix(arr, "ARRAY[")
		if !ok || !strings.HasSuffix(inner, "]") {
			return nil, false
		}
		var vals []string
		for _, item := range splitTop(inner[:len(inner)-1], ", ") {
			v, ok := literal(item)
			if !ok {
				return nil, false
			}
			vals = append(vals, v)
		}
		return vals, true
	}
	v, ok := literal(rhs)
	if !ok {
		return nil, false
	}
	return []string{v}, true
}

// scanTop calls f at each byte of s outside quotes, parentheses and
// brackets; f returns false to stop.
func scanTop(s string, f func(i int) bool) {
	depth := 0
	var q byte
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case q != 0:
			if ch == q {
				q = 0 // a doubled quote closes and reopens: same result
			}
		case ch == '\'' || ch == '"':
			q = ch
		case ch == '(' || ch == '[':
			depth++
		case ch == ')' || ch == ']':
			depth--
		case depth == 0:
			if !f(i) {
				return
			}
		}
	}
}

// splitTop splits s at each sep outside quotes and brackets.
func splitTop(s, sep string) []string {
	var parts []string
	last := 0
	scanTop(s, func(i int) bool {
		if i >= last && strings.HasPrefix(s[i:], sep) {
			parts = append(parts, s[last:i])
			last = i + len(sep)
		}
		return true
	})
	return append(parts, s[last:])
}

// stripParens removes parentheses around the whole of s.
func stripParens(s string) string {
	for len(s) >= 2 && s[0] == '(' && s[len(s)-1] == ')' {
		// The first '(' must close at the very end.
		depth, closes := 0, -1
		var q byte
		for i := 0; i < len(s) && closes < 0; i++ {
			switch ch := s[i]; {
			case q != 0:
				if ch == q {
					q = 0
				}
			case ch == '\'' || ch == '"':
				q = ch
			case ch == '(':
				depth++
			case ch == ')':
				depth--
				if depth == 0 {
					closes = i
				}
			}
		}
		if closes != len(s)-1 {
			return s
		}
		s = strings.TrimSpace(s[1 : len(s)-1])
	}
	return s
}

// stripCasts removes parentheses and trailing "::type" casts around s.
func stripCasts(s string) string {
	for {
		s = stripParens(s)
		cut := -1
		scanTop(s, func(i int) bool {
			if strings.HasPrefix(s[i:], "::") {
				cut = i
			}
			return true
		})
		if cut <= 0 {
			return s
		}
		s = strings.TrimSpace(s[:cut])
	}
}

// isColumn reports whether s, stripped of parentheses and casts, is the
// identifier col as deparsed (quoted when it needs to be).
func isColumn(s, col string) bool {
	s = stripCasts(s)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return strings.ReplaceAll(s[1:len(s)-1], `""`, `"`) == col
	}
	return s == col
}

// literal returns the value of a standard string literal, possibly cast.
func literal(s string) (string, bool) {
	s = stripCasts(s)
	if len(s) < 2 || s[0] != '\'' || s[len(s)-1] != '\'' {
		return "", false
	}
	inner := s[1 : len(s)-1]
	var b strings.Builder
	for i := 0; i < len(inner); i++ {
		if inner[i] == '\'' {
			if i+1 >= len(inner) || inner[i+1] != '\'' {
				return "", false // two literals, or not a literal at all
			}
			i++
		}
		b.WriteByte(inner[i])
	}
	return b.String(), true
}
