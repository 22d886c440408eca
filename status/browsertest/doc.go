// Package browsertest drives the status page in headless Chromium against a
// real database. It is a module of its own so that pgclaim's module does not
// require chromedp. Without a Chromium binary ($CHROMIUM, or chromium on the
// PATH) the tests are skipped, unless CI=true, where they fail. With
// -screenshots the test writes a screenshot of each view to
// docs/status-VIEW.png (go test ./... -screenshots).
package browsertest
