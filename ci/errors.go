package ci

import (
	"fmt"
	"sort"
	"strings"
)

// Pos is a position in a CI configuration file. Line and Col are 1-based; a
// zero Line means the position is unknown (for example a missing file named
// by the caller).
type Pos struct {
	File string `json:"file"`
	Line int    `json:"line"`
	Col  int    `json:"col"`
}

// String formats the position as file:line:col.
func (p Pos) String() string {
	if p.Line == 0 {
		return p.File
	}
	return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col)
}

func (p Pos) less(q Pos) bool {
	if p.File != q.File {
		return p.File < q.File
	}
	if p.Line != q.Line {
		return p.Line < q.Line
	}
	return p.Col < q.Col
}

// Error is one problem in a CI configuration, at a position.
type Error struct {
	Pos Pos    `json:"pos"`
	Msg string `json:"message"`
}

// Error formats the error as file:line:col: message.
func (e *Error) Error() string { return e.Pos.String() + ": " + e.Msg }

// Warning is a problem that does not stop the pipeline, at a position.
type Warning struct {
	Pos Pos    `json:"pos"`
	Msg string `json:"message"`
}

// String formats the warning as file:line:col: message.
func (w Warning) String() string { return w.Pos.String() + ": " + w.Msg }

// ErrorList is every error found in a configuration, sorted by position.
// Compile returns it (as error) when the configuration is invalid; any other
// error from Compile is an I/O or context error, not the user's fault.
type ErrorList []*Error

// Error joins all errors, one per line.
func (l ErrorList) Error() string {
	s := make([]string, len(l))
	for i, e := range l {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}

// Unwrap lets errors.As find an individual *Error.
func (l ErrorList) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

// diag collects errors and warnings while compiling.
type diag struct {
	errs     ErrorList
	warnings []Warning
	seen     map[string]bool
}

func (d *diag) errorf(p Pos, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	key := p.String() + "\x00" + msg
	if d.seen == nil {
		d.seen = map[string]bool{}
	}
	if d.seen[key] {
		return
	}
	d.seen[key] = true
	d.errs = append(d.errs, &Error{Pos: p, Msg: msg})
}

func (d *diag) warnf(p Pos, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	key := "w" + p.String() + "\x00" + msg
	if d.seen == nil {
		d.seen = map[string]bool{}
	}
	if d.seen[key] {
		return
	}
	d.seen[key] = true
	d.warnings = append(d.warnings, Warning{Pos: p, Msg: msg})
}

func (d *diag) failed() bool { return len(d.errs) > 0 }

// list returns the errors sorted by position (stable for equal positions).
func (d *diag) list() ErrorList {
	l := append(ErrorList(nil), d.errs...)
	sort.SliceStable(l, func(i, j int) bool { return l[i].Pos.less(l[j].Pos) })
	return l
}

func (d *diag) sortedWarnings() []Warning {
	w := append([]Warning(nil), d.warnings...)
	sort.SliceStable(w, func(i, j int) bool { return w[i].Pos.less(w[j].Pos) })
	return w
}
