package webui

import (
	"bytes"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// pageBase is what every page's layout needs.
type pageBase struct {
	Title string
	// Nav is the active section of the navigation: projects, runners or
	// fleet.
	Nav    string
	User   *principal
	Crumbs []crumb
	// Now is when the page was rendered (for "3 minutes ago").
	Now time.Time
}

// Base returns the page's base (templates reach it through any page).
func (p *pageBase) Base() *pageBase { return p }

type crumb struct{ Label, URL string }

// timeAt is a time and the page's now, for the "time" template.
type timeAt struct{ T, Now time.Time }

type based interface{ Base() *pageBase }

func parseTemplates() (*template.Template, error) {
	t := template.New("").Funcs(template.FuncMap{
		"statusLabel":      statusLabel,
		"statusClass":      statusClass,
		"statusIcon":       statusIcon,
		"ago":              ago,
		"until":            until,
		"dur":              formatDuration,
		"clock":            func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
		"rfc3339":          func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"short":            shortSHA,
		"join":             strings.Join,
		"bytes":            formatBytes,
		"hours":            func(s float64) string { return fmt.Sprintf("%.2f", s/3600) },
		"add":              func(a, b int) int { return a + b },
		"pathEscape":       pathEscape,
		"at":               func(t, now time.Time) timeAt { return timeAt{t, now} },
		"sub64":            func(a, b int64) int64 { return a - b },
		"pipelineDuration": pipelineDuration,
	})
	return t.ParseFS(templateFS, "templates/*.html")
}

// render writes a page. An htmx request (HX-Request) for a page that has
// a live part ("NAME.live") gets that part only: what the page refreshes.
func (u *UI) render(w http.ResponseWriter, r *http.Request, code int, name string, data based) {
	b := data.Base()
	if b.User == nil {
		b.User = principalOf(r.Context())
	}
	if b.Now.IsZero() {
		b.Now = u.clock.Now()
	}
	tmpl := name
	if r.Header.Get("HX-Request") != "" && u.tmpl.Lookup(name+".live") != nil {
		tmpl = name + ".live"
	}
	var buf bytes.Buffer
	if err := u.tmpl.ExecuteTemplate(&buf, tmpl, data); err != nil {
		u.log.Error("rendering a page", "page", name, "err", err)
		http.Error(w, "500 Internal Server Error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

type errorPage struct {
	pageBase
	Code    int
	Message string
}

// fail answers an error page with a message for people.
func (u *UI) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	if r.Header.Get("HX-Request") != "" || principalOf(r.Context()) == nil {
		http.Error(w, fmt.Sprintf("%d %s: %s", code, http.StatusText(code), msg), code)
		return
	}
	u.render(w, r, code, "error", &errorPage{pageBase: pageBase{Title: http.StatusText(code)}, Code: code, Message: msg})
}

func (u *UI) notFound(w http.ResponseWriter, r *http.Request, what string) {
	u.fail(w, r, http.StatusNotFound, "No such "+what+".")
}

// internal logs what failed and answers 500 without details.
func (u *UI) internal(w http.ResponseWriter, r *http.Request, what string, err error) {
	u.log.Error(what, "err", err, "path", r.URL.Path)
	u.fail(w, r, http.StatusInternalServerError, "Something went wrong; the coordinator's log says what.")
}

// statusLabel is a status as GitLab's UI words it.
func statusLabel(s store.Status) string {
	switch s {
	case store.StatusSuccess:
		return "passed"
	case store.StatusScheduled:
		return "delayed"
	case store.StatusWaitingForResource:
		return "waiting"
	case "":
		return "unknown"
	}
	return string(s)
}

func statusClass(s store.Status) string { return "status-" + strings.ReplaceAll(string(s), "_", "-") }

// statusIcon is a glyph beside the status word (the word carries the
// meaning; the glyph is decoration).
func statusIcon(s store.Status) string {
	switch s {
	case store.StatusSuccess:
		return "✓"
	case store.StatusFailed:
		return "✕"
	case store.StatusRunning:
		return "◔"
	case store.StatusPending, store.StatusWaitingForResource:
		return "◷"
	case store.StatusCanceled, store.StatusCanceling:
		return "⊘"
	case store.StatusSkipped:
		return "»"
	case store.StatusManual:
		return "⚙"
	case store.StatusScheduled:
		return "⏱"
	}
	return "○"
}

// ago says how long before now t was ("3 min ago").
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%d s ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d.Hours()))
	}
	return fmt.Sprintf("%d days ago", int(d.Hours()/24))
}

// until says how far ahead t is: "in 5 min".
func until(t, now time.Time) string {
	d := t.Sub(now)
	switch {
	case d < time.Minute:
		return "in under a minute"
	case d < time.Hour:
		return fmt.Sprintf("in %d min", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("in %d h", int(d.Hours()))
	}
	return fmt.Sprintf("in %d days", int(d.Hours()/24))
}

// formatDuration shows a duration as GitLab does: "00:42", "01:02:03".
func formatDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	return formatSeconds(int64(math.Round(d.Seconds())))
}

func shortSHA(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

func formatBytes(n int64) string {
	switch {
	case n < 1024:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/1024)
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// pathEscape escapes each segment of a slash-separated path.
func pathEscape(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}
