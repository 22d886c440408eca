package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// flags is a subcommand's flag set with the flags every subcommand shares.
type flags struct {
	*flag.FlagSet
	e        *env
	name     string
	synopsis string // e.g. "ticks [--job NAME] [--limit N]"
	about    string // what the command does, shown by -h

	url    string
	json   bool
	schema string // --schema: pgclaim's objects' schema
}

// newFlags returns a flag set for subcommand name with --database-url and
// --json defined. synopsis follows "pgclaim " in the usage line; about is the
// description printed by -h before the flags.
func newFlags(e *env, name, synopsis, about string) *flags {
	f := &flags{FlagSet: flag.NewFlagSet("pgclaim "+name, flag.ContinueOnError), e: e, name: name, synopsis: synopsis, about: about}
	f.SetOutput(io.Discard)
	f.Usage = func() {}
	f.StringVar(&f.url, "database-url", "", "PostgreSQL connection `URL` (default: $DATABASE_URL)")
	f.BoolVar(&f.json, "json", false, "print JSON instead of a table")
	switch name {
	case "grants", "schema", "bench": // grants has a --schema of its own
	default:
		f.StringVar(&f.schema, "schema", "", "the `schema` of pgclaim's objects (pgclaim.WithSchema; default: found through search_path)")
	}
	return f
}

// parse parses args, allowing flags after positional arguments
// ("migrate up --json"), and returns the positional arguments. On -h it
// prints the usage to stdout and returns flag.ErrHelp; on a bad flag it
// returns a usageError.
func (f *flags) parse(args []string) ([]string, error) {
	var pos []string
	for {
		if err := f.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				f.printUsage(f.e.stdout)
				return nil, flag.ErrHelp
			}
			return nil, usagef("%v", err)
		}
		args = f.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func (f *flags) printUsage(w io.Writer) {
	fmt.Fprintf(w, "Usage: pgclaim %s\n\n", f.synopsis)
	if f.about != "" {
		fmt.Fprintf(w, "%s\n\n", strings.TrimSpace(f.about))
	}
	fmt.Fprintln(w, "Flags:")
	var own, common []*flag.Flag
	f.VisitAll(func(fl *flag.Flag) {
		if fl.Name == "database-url" || fl.Name == "json" || fl.Name == "schema" && f.name != "grants" {
			common = append(common, fl)
		} else {
			own = append(own, fl)
		}
	})
	for _, fl := range append(own, common...) {
		typ, usage := flag.UnquoteUsage(fl)
		line := "  --" + fl.Name
		if typ != "" {
			line += " " + typ
		}
		fmt.Fprintf(w, "%s\n      %s", line, usage)
		if fl.DefValue != "" && fl.DefValue != "false" && fl.DefValue != "0" && fl.DefValue != "0s" {
			fmt.Fprintf(w, " (default %s)", fl.DefValue)
		}
		fmt.Fprintln(w)
	}
}

// noArgs rejects positional arguments.
func noArgs(pos []string) error {
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	return nil
}

// require reports a missing required flag.
func require(name, value string) error {
	if value == "" {
		return usagef("--%s is required", name)
	}
	return nil
}
