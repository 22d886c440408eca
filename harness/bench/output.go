package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

func itoa(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

// fmtUs formats a duration given in microseconds.
func fmtUs(v float64) string {
	switch {
	case v <= 0:
		return "-"
	case v < 1000:
		return fmt.Sprintf("%.0f µs", v)
	case v < 10_000:
		return fmt.Sprintf("%.2f ms", v/1000)
	case v < 1_000_000:
		return fmt.Sprintf("%.1f ms", v/1000)
	default:
		return fmt.Sprintf("%.2f s", v/1e6)
	}
}

func fmtMs(v float64) string { return fmtUs(v * 1000) }

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report as aligned plain-text tables.
func (r *Report) WriteText(w io.Writer) error {
	return r.write(w, false)
}

// WriteMarkdown writes the report as Markdown (the tables of
// docs/BENCHMARKS.md).
func (r *Report) WriteMarkdown(w io.Writer) error {
	return r.write(w, true)
}

func (r *Report) write(w io.Writer, md bool) error {
	b := &strings.Builder{}
	m := r.Machine
	h := func(level int, s string) {
		if md {
			fmt.Fprintf(b, "\n%s %s\n\n", strings.Repeat("#", level), s)
		} else {
			fmt.Fprintf(b, "\n%s\n%s\n", s, strings.Repeat("=-"[level-2:level-1], len([]rune(s))))
		}
	}
	h(2, "Run")
	item := func(s string) {
		if md {
			fmt.Fprintf(b, "- %s\n", s)
		} else {
			fmt.Fprintf(b, "  %s\n", s)
		}
	}
	item(fmt.Sprintf("command: `%s`; started %s; took %s", r.Command, r.Started.Format(time.RFC3339), (time.Duration(r.Seconds) * time.Second).String()))
	cpu := fmt.Sprintf("%d CPUs", m.CPUs)
	if m.CPUModel != "" {
		cpu += " (" + m.CPUModel + ")"
	}
	item(fmt.Sprintf("machine: %s/%s, %s, %.1f GiB memory; %s", m.OS, m.Arch, cpu, m.MemoryGiB, m.Go))
	var settings []string
	for k, v := range m.Settings {
		settings = append(settings, k+"="+v)
	}
	sort.Strings(settings)
	item(fmt.Sprintf("server: PostgreSQL %s (%s); %s; pg_stat_statements: %v", m.Postgres, m.ServerSource, strings.Join(settings, ", "), m.StatementStats))

	for _, s := range r.Scenarios {
		h(2, fmt.Sprintf("%s — %s", s.Name, s.Title))
		if s.Error != "" {
			item("ERROR: " + s.Error)
		}
		for _, x := range s.Setup {
			item(x)
		}
		for _, t := range s.Tables {
			writeTable(b, t, md)
		}
		if len(s.Checks) > 0 {
			if md {
				b.WriteString("\nChecks:\n\n")
			} else {
				b.WriteString("\n  checks:\n")
			}
			for _, c := range s.Checks {
				status := "ok"
				if !c.OK {
					status = "FAILED"
				}
				item(fmt.Sprintf("%s: %d (want %d) — %s", c.Name, c.Got, c.Want, status))
			}
		}
		for _, n := range s.Notes {
			item(n)
		}
		if len(s.Profiles) > 0 {
			writeProfiles(b, s.Profiles, md)
		}
		fmt.Fprintf(b, "\n")
		if !md {
			fmt.Fprintf(b, "  (%s: %.0f s)\n", s.Name, s.Seconds)
		}
	}
	if len(r.Ratios) > 0 {
		h(2, "Ratios (same run)")
		t := Table{Columns: []string{"ratio", "value", "of", "to"}}
		for _, x := range r.Ratios {
			t.Rows = append(t.Rows, []string{x.Name, fmt.Sprintf("%.2f×", x.Value), x.Of, x.To})
		}
		writeTable(b, t, md)
	}
	if probs := r.Problems(); len(probs) > 0 {
		h(2, "FAILED")
		for _, p := range probs {
			item(p)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeTable(b *strings.Builder, t Table, md bool) {
	if md {
		if t.Title != "" {
			fmt.Fprintf(b, "\n**%s**\n", t.Title)
		}
		b.WriteString("\n| " + strings.Join(t.Columns, " | ") + " |\n|")
		for range t.Columns {
			b.WriteString("---|")
		}
		b.WriteString("\n")
		for _, row := range t.Rows {
			cells := make([]string, len(row))
			for i, c := range row {
				cells[i] = strings.ReplaceAll(c, "|", `\|`)
			}
			b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
		}
		return
	}
	if t.Title != "" {
		fmt.Fprintf(b, "\n  %s\n", t.Title)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  "+strings.Join(t.Columns, "\t")+"\t")
	for _, row := range t.Rows {
		fmt.Fprintln(tw, "  "+strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
}

func writeProfiles(b *strings.Builder, ps []Profile, md bool) {
	if md {
		b.WriteString("\nWhere the time went (pg_stat_statements per phase; server exec = summed execution time of all statements):\n")
	} else {
		b.WriteString("\n  where the time went (pg_stat_statements per phase):\n")
	}
	for _, p := range ps {
		line := fmt.Sprintf("%s: wall %.2f s, server exec %.2f s, client CPU %.2f s of %.2f s machine CPU", p.Label, p.WallSeconds, p.ExecSeconds, p.ClientCPU, p.MachineCPU)
		if p.WALBytes > 0 {
			line += fmt.Sprintf(", WAL %.1f MB", float64(p.WALBytes)/1e6)
		}
		if md {
			fmt.Fprintf(b, "\n- %s\n", line)
		} else {
			fmt.Fprintf(b, "\n    %s\n", line)
		}
		if len(p.Statements) == 0 {
			continue
		}
		t := Table{Columns: []string{"calls", "total ms", "mean ms", "max ms", "blocks/call", "statement"}}
		n := 3
		for i, s := range p.Statements {
			if i == n {
				break
			}
			q := s.Query
			if len(q) > 110 {
				q = q[:110] + "…"
			}
			if md {
				q = "`" + strings.ReplaceAll(q, "`", "'") + "`"
			}
			t.Rows = append(t.Rows, []string{fmt.Sprintf("%d", s.Calls), fmt.Sprintf("%.0f", s.TotalMs), fmt.Sprintf("%.3f", s.MeanMs),
				fmt.Sprintf("%.1f", s.MaxMs), fmt.Sprintf("%.1f", s.BlocksPerCall), q})
		}
		if md {
			writeTable(b, t, true)
		} else {
			sub := &strings.Builder{}
			writeTable(sub, t, false)
			for _, l := range strings.Split(strings.TrimRight(sub.String(), "\n"), "\n") {
				if strings.TrimSpace(l) != "" {
					b.WriteString("    " + l + "\n")
				}
			}
		}
	}
}
