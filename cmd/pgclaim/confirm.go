package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// Asking before a change is done one way in every command that changes
// something nobody may be watching (release, sweep): the command shows
// what it would do, asks on stderr, and reads the answer from stdin; --yes
// skips the question. A command run where nobody can answer is refused
// before it does anything, whatever it would have found.

// canConfirm returns an error when stdin is a file that is not a terminal
// (a pipe, a cron job, a CI step): nobody is there to answer, and the
// operator must say --yes. verb names the change ("sweep", "release a
// lease"); instead, if not "", is another way out for the hint.
// A reader that is not a file (a test's input) is taken as an operator.
func canConfirm(e *env, verb, instead string) error {
	f, ok := e.stdin.(*os.File)
	if !ok {
		return nil
	}
	st, err := f.Stat()
	if err == nil && st.Mode()&os.ModeCharDevice != 0 {
		return nil
	}
	hint := "pass --yes to " + verb + " without asking"
	if instead != "" {
		hint += ", or " + instead
	}
	return failf(hint, "refusing to %s without confirmation: stdin is not a terminal", verb)
}

// confirm writes question and " [y/N] " to e.stderr and reads one line of
// answer from e.stdin. Only "y" or "yes" (any case) confirm; anything
// else, or no answer, declines.
func confirm(e *env, question string) bool {
	fmt.Fprintf(e.stderr, "%s [y/N] ", question)
	answer, _ := bufio.NewReader(e.stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return true
	}
	if answer == "" {
		fmt.Fprintln(e.stderr)
	}
	return false
}

// declined is the error of a change the operator did not confirm.
func declined(what string) error {
	return &failure{msg: what + ": no confirmation", hint: "answer y, or pass --yes"}
}
