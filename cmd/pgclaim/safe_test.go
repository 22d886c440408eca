package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/schedule"
)

// hostile rewrites a terminal's title, clears its screen and hides what
// follows; the bidirectional override reverses the text after it.
const hostile = "upstream 503\x1b]0;pwned\x07\x1b[2J\x1b[8m\r\u202e\u009b31m"

// Stored text with terminal escapes is printed escaped, in tables and in
// JSON (which stays JSON and decodes to the stored text).
func TestOutputEscapesStoredText(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	registerSchedules(t, db, schedule.Definition{Name: "report", Spec: "0 6 * * *", Version: 1})
	exec1(t, db, `INSERT INTO pgclaim_schedule_runs (schedule, instant, kind, state, attempt, fence, created_at, started_at, finished_at, reason)
VALUES ('report', now() - interval '1 hour', 'triggered', 'failed', 1, 1, now(), now(), now(), $1)`, hostile)
	exec1(t, db, `UPDATE pgclaim_schedules SET paused = true, paused_at = now(), paused_note = $1, paused_by = $1 WHERE name = 'report'`, hostile)
	for _, args := range [][]string{{"schedules", "list"}, {"schedules", "list", "--json"}} {
		r := cli(t, "", append(args, "--database-url", db.URL)...)
		wantCode(t, r, exitOK)
		if strings.ContainsAny(r.stdout, "\x1b\x07\r\u202e\u009b") {
			t.Errorf("%v printed control characters raw:\n%q", args, r.stdout)
		}
		wantContains(t, strings.Join(args, " "), r.stdout, `\u001b]0;pwned\u0007`)
	}
	r := cli(t, "", "schedules", "list", "--json", "--database-url", db.URL)
	var out []scheduleJSON
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out) != 1 || out[0].Last == nil || out[0].Last.Reason == nil || !strings.Contains(*out[0].Last.Reason, hostile) {
		t.Errorf("the JSON does not decode to the stored reason (%v):\n%s", err, r.stdout)
	}
}

func TestSafeWriter(t *testing.T) {
	var b bytes.Buffer
	w := newSafeWriter(&b)
	in := "a\tb\nc\x1b[1m\xff é \u202e\u009b"
	// Byte by byte: runes split across writes are kept whole.
	for i := range len(in) {
		if _, err := w.Write([]byte{in[i]}); err != nil {
			t.Fatal(err)
		}
	}
	if want := "a\tb\nc\\u001b[1m\\xff é \\u202e\\u009b"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}
