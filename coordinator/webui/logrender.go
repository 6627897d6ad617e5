package webui

import (
	"bytes"
	"fmt"
	"html"
	"strconv"
	"strings"
	"time"
)

// A job log is rendered line by line into ops: a line of HTML, or the
// start or end of a collapsible section. The server nests them into HTML
// for a page (writeLogHTML); the browser nests the ops it is streamed the
// same way (assets/berth.js). The renderer keeps what a terminal keeps
// between lines — the colours and styles in force, the sections open — so
// a log can be rendered in pieces as it grows.
//
// It understands what runners write:
//   - ANSI SGR escapes (bold, italic, underline, the 8/16 colours, the 256
//     colours and 24-bit colours, rounded to the 256), rendered as
//     classes (term-fg-N, term-bg-N, term-bold, …), never as inline
//     styles; other escapes (erase line, cursor moves) are dropped;
//   - GitLab's section markers, "section_start:UNIX:NAME[OPTIONS]\r\e[0K
//     HEADER" and "section_end:UNIX:NAME\r\e[0K", from the runner or a
//     script; [collapsed=true] starts a section closed;
//   - carriage returns: what a line shows is what follows its last \r
//     (progress bars), as a terminal would;
//   - gitlab-runner's timestamped logs (FF_TIMESTAMPS): a line starting
//     "2006-01-02T15:04:05.000000Z 00O " shows the time apart.

// logOp is one step of a rendered log.
type logOp struct {
	// Kind is "line", "start" or "end".
	Kind string `json:"op"`
	// HTML is the line's (or the section header's) markup.
	HTML string `json:"html,omitempty"`
	// Line is the line's number, from 1 (0: not counted).
	Line int `json:"n,omitempty"`
	// Time is the line's timestamp, if the log has them (RFC 3339).
	Time string `json:"t,omitempty"`
	// Section names the section a start or end is of.
	Section string `json:"section,omitempty"`
	// Collapsed: the section starts closed.
	Collapsed bool `json:"collapsed,omitempty"`
	// Duration is the section's duration at its end ("1m 05s").
	Duration string `json:"duration,omitempty"`
	// Start is when the section started (RFC 3339).
	Start string `json:"start,omitempty"`
}

// sgr is the style in force.
type sgr struct {
	fg, bg                                  int // -1: default; 0-255
	bold, faint, italic, underline, inverse bool
	strike                                  bool
}

var plain = sgr{fg: -1, bg: -1}

type openSection struct {
	name  string
	start int64
}

// logRenderer renders a log's bytes into ops. Feed it bytes in order;
// it holds an incomplete last line until more comes or Flush.
type logRenderer struct {
	style    sgr
	sections []openSection
	partial  []byte
	line     int  // lines rendered so far
	numbered bool // count lines (the log is rendered from its start)
}

// maxLine bounds a line held while incomplete: a longer one is cut.
const maxLine = 1 << 20

// maxSections bounds how deep sections nest; deeper starts are shown as
// lines.
const maxSections = 32

// newLogRenderer returns a renderer at the start of a log (numbered: its
// lines are counted from 1) or of a piece of one.
func newLogRenderer(numbered bool) *logRenderer {
	return &logRenderer{style: plain, numbered: numbered}
}

// Write renders the complete lines of p (and of what was held), returning
// their ops.
func (r *logRenderer) Write(p []byte) []logOp {
	var ops []logOp
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			r.partial = append(r.partial, p...)
			if len(r.partial) > maxLine {
				ops = r.renderLine(r.partial, ops)
				r.partial = r.partial[:0]
			}
			break
		}
		if len(r.partial) > 0 {
			r.partial = append(r.partial, p[:i]...)
			ops = r.renderLine(r.partial, ops)
			r.partial = r.partial[:0]
		} else {
			ops = r.renderLine(p[:i], ops)
		}
		p = p[i+1:]
	}
	return ops
}

// Flush renders the incomplete last line, if any (the log is complete).
func (r *logRenderer) Flush() []logOp {
	if len(r.partial) == 0 {
		return nil
	}
	ops := r.renderLine(r.partial, nil)
	r.partial = r.partial[:0]
	return ops
}

// renderLine renders one line (without its \n).
func (r *logRenderer) renderLine(b []byte, ops []logOp) []logOp {
	b = bytes.TrimSuffix(b, []byte{'\r'})
	var ts string
	if t, rest, ok := cutTimestamp(b); ok {
		ts, b = t, rest
	}
	if name, unix, opts, header, ok := cutSectionStart(b); ok && len(r.sections) < maxSections {
		r.sections = append(r.sections, openSection{name: name, start: unix})
		start := ""
		if unix > 0 {
			start = time.Unix(unix, 0).UTC().Format(time.RFC3339)
		}
		r.line++
		op := logOp{Kind: "start", Section: name, Start: start, Time: ts, Collapsed: strings.Contains(opts, "collapsed=true")}
		op.HTML = r.spans(overprint(header))
		if r.numbered {
			op.Line = r.line
		}
		return append(ops, op)
	}
	if name, unix, ok := cutSectionEnd(b); ok {
		// Close up to the named section; an end of a section not open
		// is dropped.
		for i := len(r.sections) - 1; i >= 0; i-- {
			if r.sections[i].name != name {
				continue
			}
			for len(r.sections) > i {
				s := r.sections[len(r.sections)-1]
				r.sections = r.sections[:len(r.sections)-1]
				op := logOp{Kind: "end", Section: s.name}
				if s.name == name && unix >= s.start && s.start > 0 {
					op.Duration = formatSeconds(unix - s.start)
				}
				ops = append(ops, op)
			}
			break
		}
		return ops
	}
	r.line++
	op := logOp{Kind: "line", Time: ts, HTML: r.spans(overprint(b))}
	if r.numbered {
		op.Line = r.line
	}
	return append(ops, op)
}

// overprint keeps what a terminal shows of a line with carriage returns:
// the text after the last \r that is followed by any.
func overprint(b []byte) []byte {
	for {
		i := bytes.LastIndexByte(b, '\r')
		if i < 0 {
			return b
		}
		if rest := b[i+1:]; len(bytes.TrimSpace(stripEscapes(rest))) > 0 {
			return rest
		}
		b = b[:i]
	}
}

// stripEscapes drops ANSI escapes (for emptiness checks only).
func stripEscapes(b []byte) []byte {
	if bytes.IndexByte(b, 0x1b) < 0 {
		return b
	}
	var out []byte
	for i := 0; i < len(b); i++ {
		if b[i] == 0x1b {
			i += escapeLen(b[i:]) - 1
			continue
		}
		out = append(out, b[i])
	}
	return out
}

// escapeLen is the length of the escape sequence at the start of b (b[0]
// is ESC): CSI sequences up to their final byte, others two bytes.
func escapeLen(b []byte) int {
	if len(b) < 2 {
		return len(b)
	}
	if b[1] != '[' {
		return 2
	}
	for i := 2; i < len(b); i++ {
		if b[i] >= 0x40 && b[i] <= 0x7e {
			return i + 1
		}
	}
	return len(b)
}

// spans renders text with its escapes as HTML, updating the style.
func (r *logRenderer) spans(b []byte) string {
	var out strings.Builder
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		text := html.EscapeString(strings.ToValidUTF8(string(run), "\uFFFD"))
		if cls := r.style.classes(); cls != "" {
			out.WriteString(`<span class="` + cls + `">` + text + `</span>`)
		} else {
			out.WriteString(text)
		}
		run = run[:0]
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == 0x1b:
			n := escapeLen(b[i:])
			seq := b[i : i+n]
			if len(seq) >= 3 && seq[1] == '[' && seq[len(seq)-1] == 'm' {
				flush()
				r.style.apply(string(seq[2 : len(seq)-1]))
			}
			i += n - 1
		case c == '\t' || c >= 0x20 && c != 0x7f:
			run = append(run, c)
		}
	}
	flush()
	return out.String()
}

// apply applies an SGR parameter list ("1;31", "38;5;208", "").
func (s *sgr) apply(params string) {
	if params == "" {
		*s = plain
		return
	}
	ps := strings.Split(params, ";")
	num := func(i int) int {
		if i >= len(ps) {
			return -1
		}
		n, err := strconv.Atoi(ps[i])
		if err != nil || n < 0 || n > 255 {
			return -1
		}
		return n
	}
	for i := 0; i < len(ps); i++ {
		n := num(i)
		switch {
		case n == 0 || ps[i] == "":
			*s = plain
		case n == 1:
			s.bold = true
		case n == 2:
			s.faint = true
		case n == 3:
			s.italic = true
		case n == 4:
			s.underline = true
		case n == 7:
			s.inverse = true
		case n == 9:
			s.strike = true
		case n == 22:
			s.bold, s.faint = false, false
		case n == 23:
			s.italic = false
		case n == 24:
			s.underline = false
		case n == 27:
			s.inverse = false
		case n == 29:
			s.strike = false
		case n >= 30 && n <= 37:
			s.fg = n - 30
		case n == 39:
			s.fg = -1
		case n >= 40 && n <= 47:
			s.bg = n - 40
		case n == 49:
			s.bg = -1
		case n >= 90 && n <= 97:
			s.fg = n - 90 + 8
		case n >= 100 && n <= 107:
			s.bg = n - 100 + 8
		case n == 38 || n == 48:
			c, used := extendedColor(num, i+1)
			i += used
			if c >= 0 {
				if n == 38 {
					s.fg = c
				} else {
					s.bg = c
				}
			}
		}
	}
}

// extendedColor reads "5;N" or "2;R;G;B" at ps[i:], returning the colour
// (a 256-colour index, -1 if invalid) and how many parameters it used.
func extendedColor(num func(int) int, i int) (int, int) {
	switch num(i) {
	case 5:
		return num(i + 1), 2
	case 2:
		r, g, b := num(i+1), num(i+2), num(i+3)
		if r < 0 || g < 0 || b < 0 {
			return -1, 4
		}
		// The 6×6×6 cube of the 256 colours.
		q := func(v int) int { return (v*5 + 127) / 255 }
		return 16 + 36*q(r) + 6*q(g) + q(b), 4
	}
	return -1, 1
}

func (s sgr) classes() string {
	if s == plain {
		return ""
	}
	var c []string
	fg, bg := s.fg, s.bg
	if s.inverse {
		fg, bg = bg, fg
		if fg < 0 {
			fg = 256 // the default background as a foreground
		}
		if bg < 0 {
			bg = 257
		}
	}
	if fg >= 0 {
		c = append(c, "term-fg-"+strconv.Itoa(fg))
	}
	if bg >= 0 {
		c = append(c, "term-bg-"+strconv.Itoa(bg))
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{s.bold, "term-bold"}, {s.faint, "term-faint"}, {s.italic, "term-italic"}, {s.underline, "term-underline"}, {s.strike, "term-strike"}} {
		if f.on {
			c = append(c, f.name)
		}
	}
	return strings.Join(c, " ")
}

// cutTimestamp splits gitlab-runner's line prefix "2006-01-02T15:04:05.000000Z
// 00O " (or "00E", "00O+") from a line.
func cutTimestamp(b []byte) (string, []byte, bool) {
	const tsLen = len("2006-01-02T15:04:05.000000Z")
	if len(b) < tsLen+5 || b[4] != '-' || b[10] != 'T' || b[tsLen-1] != 'Z' || b[tsLen] != ' ' {
		return "", b, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(b[:tsLen]))
	if err != nil {
		return "", b, false
	}
	rest := b[tsLen+1:]
	if len(rest) < 3 || !isHex(rest[0]) || !isHex(rest[1]) || (rest[2] != 'O' && rest[2] != 'E') {
		return "", b, false
	}
	rest = rest[3:]
	rest = bytes.TrimPrefix(rest, []byte{'+'})
	rest = bytes.TrimPrefix(rest, []byte{' '})
	return t.UTC().Format(time.RFC3339Nano), rest, true
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// sectionMarker finds "section_start:" or "section_end:" in a line, after
// nothing but escapes, and returns what follows it.
func sectionMarker(b []byte, marker string) ([]byte, bool) {
	i := bytes.Index(b, []byte(marker))
	if i < 0 || len(bytes.TrimSpace(stripEscapes(b[:i]))) > 0 {
		return nil, false
	}
	return b[i+len(marker):], true
}

// cutSection reads "UNIX:NAME[OPTS]" up to its \r; rest is after \r and
// an optional \e[0K.
func cutSection(b []byte) (name string, unix int64, opts string, rest []byte, ok bool) {
	colon := bytes.IndexByte(b, ':')
	if colon <= 0 || colon > 20 {
		return "", 0, "", nil, false
	}
	unix, err := strconv.ParseInt(string(b[:colon]), 10, 64)
	if err != nil || unix < 0 {
		return "", 0, "", nil, false
	}
	b = b[colon+1:]
	cr := bytes.IndexByte(b, '\r')
	if cr < 0 {
		return "", 0, "", nil, false
	}
	spec := string(b[:cr])
	rest = b[cr+1:]
	if j := strings.IndexByte(spec, '['); j >= 0 && strings.HasSuffix(spec, "]") {
		spec, opts = spec[:j], spec[j+1:len(spec)-1]
	}
	if !validSectionName(spec) {
		return "", 0, "", nil, false
	}
	for bytes.HasPrefix(rest, []byte("\x1b[0K")) {
		rest = rest[len("\x1b[0K"):]
	}
	return spec, unix, opts, rest, true
}

func validSectionName(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func cutSectionStart(b []byte) (name string, unix int64, opts string, header []byte, ok bool) {
	after, ok := sectionMarker(b, "section_start:")
	if !ok {
		return "", 0, "", nil, false
	}
	name, unix, opts, header, ok = cutSection(after)
	return
}

func cutSectionEnd(b []byte) (string, int64, bool) {
	after, ok := sectionMarker(b, "section_end:")
	if !ok {
		return "", 0, false
	}
	name, unix, _, _, ok := cutSection(after)
	return name, unix, ok
}

// formatSeconds is a duration as GitLab shows a section's: "00:42",
// "12:03", "1:02:03".
func formatSeconds(s int64) string {
	h, m, sec := s/3600, s/60%60, s%60
	if h > 0 {
		return fmt.Sprintf("%d:%02d:%02d", h, m, sec)
	}
	return fmt.Sprintf("%02d:%02d", m, sec)
}

// writeLogHTML nests ops into HTML: lines as <div class="line">, sections
// as <details> with their header as <summary>. Sections left open by the
// ops stay open (closed at the end of the markup, so it is well formed).
func writeLogHTML(w *strings.Builder, ops []logOp) {
	// A section's duration is known at its end: give it to its start,
	// whose header shows it.
	durations := make(map[int]string) // of the sections that end
	var stack []int
	for i, op := range ops {
		switch op.Kind {
		case "start":
			stack = append(stack, i)
		case "end":
			if len(stack) > 0 {
				durations[stack[len(stack)-1]] = op.Duration
				stack = stack[:len(stack)-1]
			}
		}
	}
	depth := 0
	for i, op := range ops {
		switch op.Kind {
		case "start":
			open := " open"
			if op.Collapsed {
				open = ""
			}
			ended := ""
			if _, ok := durations[i]; ok {
				ended = " data-ended"
			}
			fmt.Fprintf(w, `<details class="section" data-section="%s"%s%s><summary class="line section-header">`, html.EscapeString(op.Section), ended, open)
			lineHead(w, op)
			w.WriteString(`<span class="txt">` + op.HTML + `</span><span class="section-duration">` + html.EscapeString(durations[i]) + `</span></summary>`)
			depth++
		case "end":
			if depth > 0 {
				w.WriteString("</details>")
				depth--
			}
		default:
			w.WriteString(`<div class="line">`)
			lineHead(w, op)
			w.WriteString(`<span class="txt">` + op.HTML + "</span></div>")
		}
	}
	for ; depth > 0; depth-- {
		w.WriteString("</details>")
	}
}

func lineHead(w *strings.Builder, op logOp) {
	if op.Line > 0 {
		fmt.Fprintf(w, `<a class="ln" id="L%d" href="#L%d" aria-hidden="true" tabindex="-1">%d</a>`, op.Line, op.Line, op.Line)
	}
	if op.Time != "" {
		fmt.Fprintf(w, `<time class="ts" datetime="%s">%s</time>`, op.Time, html.EscapeString(shortTime(op.Time)))
	}
}

// shortTime shows an RFC 3339 time as HH:MM:SS.
func shortTime(s string) string {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC().Format("15:04:05")
	}
	return ""
}
