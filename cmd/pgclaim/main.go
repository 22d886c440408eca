package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// command is one subcommand of pgclaim.
//
// To add a subcommand, write it in its own file (for example bench.go) and
// register it there with one line:
//
//	func init() { register(command{name: "bench", summary: "…", run: runBench}) }
//
// run receives the arguments after the subcommand's name. It builds its flag
// set with newFlags (which adds --database-url and --json and handles -h),
// opens the database with flags.connect (requireSchema checks pgclaim's
// tables), writes its results to e.stdout (newTable for an aligned table, or
// writeJSON when flags.json is set; progress goes to e.stderr, never with
// --json) and returns an error: a
// usageError for bad arguments (exit status 2), anything else for a failure
// (exit status 1). Errors made with failf carry a hint line for the operator.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, e *env, args []string) error
}

// commands lists the subcommands in the order "pgclaim help" shows them.
// Subcommands in other files append themselves with register.
var commands = []command{
	{name: "migrate", summary: "apply pgclaim's migrations (up) or list them (status)", run: runMigrate},
	{name: "ticks", summary: "recent runs in the tick ledger, per job", run: runTicks},
	{name: "locks", summary: "lease locks, advisory locks held and open election terms", run: runLocks},
	{name: "claims", summary: "rows per state of a claimed table, oldest and stale in-progress rows", run: runClaims},
	{name: "sweep", summary: "move rows stuck in progress to another state (with --dry-run)", run: runSweep},
	{name: "release", summary: "free a lease lock, fenced, after confirmation", run: runRelease},
}

// register adds a subcommand; call it from an init function.
func register(c command) { commands = append(commands, c) }

func lookup(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// env is what a subcommand may use of the outside world.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer // escaped (safeWriter) by runEnv
	getenv         func(string) string
	// progress is standard error as given, for progress lines that
	// rewrite themselves with carriage returns; nothing stored is written
	// to it.
	progress io.Writer
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// run runs pgclaim with args (without the program name) and returns the
// exit status. The environment is read with os.Getenv.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runEnv(ctx, &env{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv}, args)
}

func runEnv(ctx context.Context, e *env, args []string) int {
	if e.progress == nil {
		e2 := *e
		e2.progress = e.stderr
		e2.stdout, e2.stderr = newSafeWriter(e.stdout), newSafeWriter(e.stderr)
		e = &e2
	}
	if len(args) == 0 {
		printUsage(e.stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) == 0 || name != "help" {
			printUsage(e.stdout)
			return exitOK
		}
		c, ok := lookup(rest[0])
		if !ok {
			fmt.Fprintf(e.stderr, "pgclaim help: unknown command %q\n", rest[0])
			printUsage(e.stderr)
			return exitUsage
		}
		name, rest = c.name, []string{"-h"}
	}
	c, ok := lookup(name)
	if !ok {
		fmt.Fprintf(e.stderr, "pgclaim: unknown command %q\n", name)
		printUsage(e.stderr)
		return exitUsage
	}
	err := c.run(ctx, e, rest)
	return report(e.stderr, c.name, err)
}

// report prints err for the subcommand and returns the exit status.
func report(w io.Writer, name string, err error) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(w, "pgclaim %s: %s\n", name, ue.msg)
		fmt.Fprintf(w, "Run 'pgclaim %s -h' for usage.\n", name)
		return exitUsage
	}
	var fe *failure
	if errors.As(err, &fe) {
		fmt.Fprintf(w, "pgclaim %s: %s\n", name, fe.msg)
		if fe.hint != "" {
			fmt.Fprintf(w, "hint: %s\n", fe.hint)
		}
		return exitError
	}
	fmt.Fprintf(w, "pgclaim %s: %v\n", name, err)
	return exitError
}

func printUsage(w io.Writer) {
	var b strings.Builder
	b.WriteString("pgclaim: operate pgclaim's tables in a PostgreSQL database.\n\n")
	b.WriteString("Usage:\n  pgclaim COMMAND [flags]\n\nCommands:\n")
	width := 0
	for _, c := range commands {
		width = max(width, len(c.name))
	}
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, c.name, c.summary)
	}
	b.WriteString(`
Every command takes --database-url (default: the DATABASE_URL environment
variable) and --json (print JSON instead of a table).
Run 'pgclaim help COMMAND' or 'pgclaim COMMAND -h' for a command's flags.
Exit status: 0 on success, 1 on error, 2 on a usage error.
`)
	io.WriteString(w, b.String())
}

// usageError is a bad command line; it exits with status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// failure is an error with a hint telling the operator what to do about it.
type failure struct {
	msg  string
	hint string
	err  error // the cause, for errors.Is; may be nil
}

func (e *failure) Error() string { return e.msg }
func (e *failure) Unwrap() error { return e.err }

func failf(hint string, format string, args ...any) error {
	return &failure{msg: fmt.Sprintf(format, args...), hint: hint}
}
