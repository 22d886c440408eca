package main

import (
	"fmt"
	"io"
	"unicode"
	"unicode/utf8"
)

// safeWriter escapes what would drive a terminal instead of being shown:
// control characters other than newline and tab (escape sequences,
// carriage returns, C1 controls) and bidirectional formatting characters,
// written as \uXXXX; bytes that are not UTF-8 as \xNN. Stored text (names,
// reasons, holders, notes) reaches the CLI's output from the database, and
// a reason with terminal escapes must not rewrite the operator's screen.
// The escape is valid inside a JSON string and means the same character
// there, so JSON output stays JSON. A rune split across writes is held
// until its end arrives.
type safeWriter struct {
	w       io.Writer
	pending []byte
}

func newSafeWriter(w io.Writer) *safeWriter { return &safeWriter{w: w} }

func (s *safeWriter) Write(p []byte) (int, error) {
	buf := append(s.pending, p...)
	s.pending = nil
	out := make([]byte, 0, len(buf))
	for i := 0; i < len(buf); {
		r, n := utf8.DecodeRune(buf[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			if !utf8.FullRune(buf[i:]) {
				s.pending = append([]byte(nil), buf[i:]...)
				i = len(buf)
				continue
			}
			out = fmt.Appendf(out, `\x%02x`, buf[i])
			n = 1
		case r == '\n' || r == '\t':
			out = append(out, byte(r))
		case unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r):
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, buf[i:i+n]...)
		}
		i += n
	}
	if _, err := s.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}
