package browsertest

import (
	"bufio"
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/pgclaim/pgclaim/pgtest"
	"github.com/pgclaim/pgclaim/status/internal/scenario"
)

// servePgclaim builds the pgclaim command and runs "pgclaim serve" with an
// action token on a free loopback port until the test ends; it returns the
// page's base URL.
func servePgclaim(t *testing.T, dbURL, token string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pgclaim")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/pgclaim/pgclaim/cmd/pgclaim").CombinedOutput(); err != nil {
		t.Fatalf("building pgclaim: %v\n%s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "serve", "--addr", "127.0.0.1:0", "--refresh", "1h", "--database-url", dbURL)
	cmd.Env = append(cmd.Environ(), "PGCLAIM_ACTION_TOKEN="+token)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	base := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`on (http://\S+/) `)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log("pgclaim serve: " + sc.Text())
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				base <- m[1]
			}
		}
	}()
	select {
	case b := <-base:
		return b
	case <-time.After(60 * time.Second):
		t.Fatal("pgclaim serve did not start")
	}
	return ""
}

// Logging in to "pgclaim serve" in a browser: a wrong token is refused, the
// right one shows the actions and a log out; an action without a session
// is refused; logging out hides the actions again.
func TestServeLoginInBrowser(t *testing.T) {
	db := pgtest.NewDatabase(t)
	sc := scenario.Start(t, db.Pool)
	const token = "0f3c9a51d2e87b46a5c1e09d73b28f64"
	base := servePgclaim(t, db.URL, token)
	b := newBrowser(t, base)
	ctx := t.Context()

	// Anonymous: read-only, with a way to log in.
	b.open("schedules")
	if n := b.count(`form[action="actions/pause"], input[name="csrf"]`); n != 0 {
		t.Errorf("anonymous: %d action form elements, want none", n)
	}
	if n := b.count(`#login`); n != 1 {
		t.Fatal("anonymous: no log in link")
	}

	// A wrong token is refused.
	b.do("log in with a wrong token",
		chromedp.Click(chromedp.CSS(`#login`)),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), "not-the-token-at-all-0123456789"),
		chromedp.Submit(chromedp.CSS(`input[name="token"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#login-error`)))
	if s := b.text(`#login-error`); s != "wrong token" {
		t.Errorf("after a wrong token: %q", s)
	}

	login := func() {
		t.Helper()
		b.do("log in",
			chromedp.Navigate(base+"login"),
			chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
			chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
			chromedp.Submit(chromedp.CSS(`input[name="token"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#logout`)))
	}
	login()
	if n := b.count(row(scenario.Ticking) + ` button.pause`); n != 1 {
		t.Fatalf("logged in: %d pause buttons for %s, want 1", n, scenario.Ticking)
	}
	b.screenshot("login")

	// The session ends (as when it expires): the action is refused.
	if _, err := chromedp.Call(b.ctx, network.DeleteCookies, network.DeleteCookiesParams{Name: "pgclaim_session", URL: base}); err != nil {
		t.Fatalf("dropping the session cookie: %v", err)
	}
	b.do("pause without a session",
		chromedp.SendKeys(chromedp.CSS(row(scenario.Ticking)+` input[name="note"]`), "no session"),
		chromedp.Click(chromedp.CSS(row(scenario.Ticking)+` button.pause`)),
		chromedp.WaitNotPresent(chromedp.CSS(`main`)))
	if body := b.text(`body`); !strings.Contains(body, "refused: log in at /login") {
		t.Errorf("pause without a session: page says %q", body)
	}
	if st, err := sc.Operator.Status(ctx, scenario.Ticking); err != nil || st.Paused {
		t.Errorf("a pause without a session paused the schedule (%v, %v)", st.Paused, err)
	}

	// Logged in again, a pause is recorded as the session's; logging out
	// hides the actions.
	login()
	b.do("pause",
		chromedp.SendKeys(chromedp.CSS(row(scenario.Ticking)+` input[name="note"]`), "deploying v3"),
		chromedp.Click(chromedp.CSS(row(scenario.Ticking)+` button.pause`)),
		chromedp.WaitVisible(chromedp.CSS(`#msg-ok`)))
	if st, err := sc.Operator.Status(ctx, scenario.Ticking); err != nil || !st.Paused || !strings.HasPrefix(st.PausedBy, "pgclaim serve: action token (session ") {
		t.Errorf("after pausing: paused %v by %q (%v)", st.Paused, st.PausedBy, err)
	}
	b.do("log out", chromedp.Click(chromedp.CSS(`#logout`)), chromedp.WaitVisible(chromedp.CSS(`#login`)))
	if n := b.count(`form[action="actions/pause"], form[action="actions/resume"], input[name="csrf"]`); n != 0 {
		t.Errorf("after logging out: %d action form elements, want none", n)
	}
	if b.dialog.Load() {
		t.Error("a JavaScript dialog opened")
	}
}
