package browsertest

import (
	"context"
	"flag"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/status"
	"github.com/pgclaim/pgclaim/status/internal/scenario"
)

// chromium finds the browser: $CHROMIUM, else chromium on the PATH.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium found (install the Debian package chromium, or set CHROMIUM)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// docsDir is where the screenshots go with -screenshots: the repository's
// docs/. Without it they go to the test's temporary directory, so a test
// run leaves the working tree as it was.
const docsDir = "../../docs"

var writeScreenshots = flag.Bool("screenshots", false, "write the views' screenshots to docs/ (go test ./... -screenshots)")

type browser struct {
	t      *testing.T
	ctx    context.Context
	base   string
	dialog atomic.Bool
}

func newBrowser(t *testing.T, base string) *browser {
	exe := chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU,
		chromedp.WindowSize(1360, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelA() })
	b := &browser{t: t, ctx: ctx, base: base}
	// The first call starts the browser; it lives as long as ctx.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			b.dialog.Store(true)
			t.Logf("a dialog opened: %q", ev.Message)
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	return b
}

func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

func (b *browser) open(view string) {
	b.t.Helper()
	b.do("open "+view, chromedp.Navigate(b.base+view), chromedp.WaitReady(chromedp.CSS("main")))
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.t.Errorf("reading %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

func (b *browser) count(sel string) int {
	b.t.Helper()
	n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](`document.querySelectorAll(`+jsString(sel)+`).length`))
	if err != nil {
		b.t.Fatalf("counting %s: %v", sel, err)
	}
	return n
}

func (b *browser) screenshot(view string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot of %s: %v", view, err)
	}
	dir := docsDir
	if !*writeScreenshots {
		dir = b.t.TempDir()
	}
	path := filepath.Join(dir, "status-"+view+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("wrote %s (%d bytes)", path, len(png))
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`, "<", `\x3c`)
	return "'" + r.Replace(s) + "'"
}

func row(name string) string { return `tr.schedule[data-name=` + cssString(name) + `]` }

func cssString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

func TestStatusPageInBrowser(t *testing.T) {
	db := pgtest.NewDatabase(t)
	sc := scenario.Start(t, db.Pool)
	h, err := status.New(status.Config{
		Pool: db.Pool, Tables: scenario.Tables(), Grace: scenario.Grace, Actions: true,
		Refresh: 30 * time.Second, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/pgclaim/", http.StripPrefix("/pgclaim", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	b := newBrowser(t, srv.URL+"/pgclaim/")
	ctx := t.Context()

	// The schedules: a running run, a missed instant, a paused schedule
	// with its note, and the hostile name as text.
	// The page is reloaded until the run shows running: the scenario saw
	// its job start, and the page once showed no running tick right after
	// (CI, PostgreSQL 15).
	running := 0
	for deadline := time.Now().Add(20 * time.Second); ; {
		b.open("schedules")
		if running = b.count(row(scenario.Running) + ` .tick[data-state="running"]`); running == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if running != 1 {
		t.Errorf("%s: %d running ticks in the timeline, want 1", scenario.Running, running)
	}
	if n := b.count(row(scenario.Missed) + ` .tick[data-state="missed"]`); n < 1 {
		t.Errorf("%s: no missed tick in the timeline", scenario.Missed)
	}
	if s := b.text(row(scenario.Missed) + ` .missed-count`); !strings.Contains(s, "missed") {
		t.Errorf("%s: missed count %q", scenario.Missed, s)
	}
	if s := b.text(row(scenario.Paused) + ` .paused-badge`); s != "paused" {
		t.Errorf("%s: paused badge %q", scenario.Paused, s)
	}
	if s := b.text(row(scenario.Paused) + ` .paused-note`); s != scenario.PausedNote {
		t.Errorf("%s: note %q, want %q", scenario.Paused, s, scenario.PausedNote)
	}
	if s := b.text(row(scenario.Hostile) + ` .name`); s != scenario.Hostile {
		t.Errorf("the hostile job's name renders as %q, want the text %q", s, scenario.Hostile)
	}
	if s := b.text(row(scenario.Hostile) + ` .reason`); !strings.HasSuffix(s, scenario.HostileReason) {
		t.Errorf("the hostile reason renders as %q, want the text %q", s, scenario.HostileReason)
	}
	if n := b.count(`script, img, main i`); n != 0 {
		t.Errorf("%d script, img or i elements made from the database's text", n)
	}
	b.screenshot("schedules")

	b.open("claims")
	if s := b.text(`.stuck`); s != "1 stuck" {
		t.Errorf("claims: stuck badge %q, want \"1 stuck\"", s)
	}
	if s := b.text(`.reasons .reason`); s != scenario.HostileReason {
		t.Errorf("claims: reason %q", s)
	}
	b.screenshot("claims")

	b.open("leaders")
	if s := b.text(`#leaders .leader .name`); s != scenario.Election {
		t.Errorf("leaders: %q, want %s", s, scenario.Election)
	}
	b.screenshot("leaders")

	b.open("locks")
	if s := b.text(`#leases .lease .name`); s != scenario.Lease {
		t.Errorf("locks: lease %q, want %s", s, scenario.Lease)
	}
	b.screenshot("locks")

	// Pausing from the page stops the runs, and List shows the pause.
	waitFor(t, "runs of "+scenario.Ticking, func() bool { return sc.TickingRuns.Load() > 0 })
	b.open("schedules")
	b.do("pause "+scenario.Ticking,
		chromedp.SendKeys(chromedp.CSS(row(scenario.Ticking)+` input[name="note"]`), "deploying v2"),
		chromedp.Click(chromedp.CSS(row(scenario.Ticking)+` button.pause`)),
		chromedp.WaitVisible(chromedp.CSS(`#msg-ok`)))
	if s := b.text(`#msg-ok`); s != "paused "+scenario.Ticking {
		t.Errorf("after pausing: message %q", s)
	}
	if s := b.text(row(scenario.Ticking) + ` .paused-note`); s != "deploying v2" {
		t.Errorf("after pausing: note %q", s)
	}
	all, err := sc.Operator.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range all {
		if st.Name == scenario.Ticking && (!st.Paused || st.PausedNote != "deploying v2") {
			t.Errorf("List after pausing from the page: %+v", st)
		}
	}
	time.Sleep(1500 * time.Millisecond) // a run that started before the pause finishes
	before := sc.TickingRuns.Load()
	time.Sleep(3 * time.Second)
	if after := sc.TickingRuns.Load(); after != before {
		t.Errorf("%s ran %d times in the 3s after its pause", scenario.Ticking, after-before)
	}

	// An action without the CSRF token is refused.
	if _, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`(document.querySelector(`+
		jsString(row(scenario.Ticking)+` form[action="actions/resume"] input[name="csrf"]`)+`).remove(), true)`)); err != nil {
		t.Fatalf("removing the CSRF token from the form: %v", err)
	}
	b.do("resume without the CSRF token",
		chromedp.Click(chromedp.CSS(row(scenario.Ticking)+` button.resume`)),
		chromedp.WaitNotPresent(chromedp.CSS(`main`)))
	body := b.text(`body`)
	if !strings.Contains(body, "refused: missing or wrong CSRF token") {
		t.Errorf("resume without the token: page says %q", body)
	}
	st, err := sc.Operator.Status(ctx, scenario.Ticking)
	if err != nil || !st.Paused {
		t.Errorf("a resume without the CSRF token resumed the schedule (paused %v, %v)", st.Paused, err)
	}

	if b.dialog.Load() {
		t.Error("a JavaScript dialog opened: text from the database ran as script")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 30s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
