// Package dotenv reads dotenv reports (artifacts:reports:dotenv): the
// variables a job passes to the jobs that depend on it, to the runner's
// payload (runnerhttp) and to a trigger job's downstream pipeline
// (pipelines).
package dotenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// Dotenv report limits, GitLab's defaults on a self-managed instance
// (plan limits dotenv_size and dotenv_variables).
const (
	// MaxSize bounds the uploaded dotenv artifact as stored (the
	// gzip the runner sends): it must be smaller.
	MaxSize = 5 * 1024
	// MaxVariables bounds the number of variables of a report.
	MaxVariables = 20
	// maxText bounds the decompressed text, which GitLab does not
	// (a 5 KB gzip can hold megabytes).
	maxText = 1 << 20
)

// Error is what is wrong with a dotenv report; Line is 1-based in
// the file (the gzip member) it is in, 0 when the error is not a line's.
type Error struct {
	Line int
	Msg  string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("dotenv line %d: %s", e.Line, e.Msg)
	}
	return "dotenv: " + e.Msg
}

// Parse parses a stored dotenv report of a format (gzip,
// as the runner uploads it, possibly several members, one a file; or
// raw) the way GitLab's Ci::ParseDotenvArtifactService does: each line
// is KEY=VALUE, split at the first '=', both sides trimmed of whitespace;
// no empty lines, comments or quoting (quotes stay part of the value); a
// key of letters, digits and '_' (at most 255); a key given again keeps
// its first place and takes the last value; at most MaxVariables
// variables. UTF-16LE text (with its BOM) is converted, a UTF-8 BOM
// dropped, invalid UTF-8 replaced. The variables are not raw: the runner
// expands them.
func Parse(data []byte, format string) ([]runnerapi.Variable, error) {
	texts, err := artifacts.ReportFiles(data, format, maxText)
	if err != nil {
		return nil, &Error{Msg: err.Error()}
	}
	var vars []runnerapi.Variable
	index := map[string]int{}
	for _, text := range texts {
		for n, line := range strings.SplitAfter(utf8Text(text), "\n") {
			if line == "" {
				continue // after the last newline
			}
			key, value, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "=")
			if !ok {
				return nil, &Error{Line: n + 1, Msg: "Invalid Format: want KEY=VALUE (no empty lines or comments)"}
			}
			key, value = strings.Trim(key, space), strings.Trim(value, space)
			if msg := keyProblem(key); msg != "" {
				return nil, &Error{Line: n + 1, Msg: msg}
			}
			if i, ok := index[key]; ok {
				vars[i].Value = value
				continue
			}
			index[key] = len(vars)
			vars = append(vars, runnerapi.Variable{Key: key, Value: value})
		}
	}
	if len(vars) > MaxVariables {
		return nil, &Error{Msg: fmt.Sprintf("Dotenv files cannot have more than %d variables", MaxVariables)}
	}
	return vars, nil
}

// space is what Ruby's String#strip removes.
const space = " \t\n\v\f\r\x00"

// utf8Text is a file's text as UTF-8, as GitLab reads it: UTF-16LE
// (by its BOM) converted, a UTF-8 BOM dropped, invalid bytes replaced.
func utf8Text(b []byte) string {
	if len(b) >= 2 && b[0] == 0xFF && b[1] == 0xFE {
		b = b[2:]
		u := make([]uint16, len(b)/2)
		for i := range u {
			u[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
		}
		return string(utf16.Decode(u))
	}
	b = bytes.TrimPrefix(b, []byte("\xEF\xBB\xBF"))
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// keyProblem says what is wrong with a key, GitLab's rule for
// variable keys; empty if nothing.
func keyProblem(key string) string {
	switch {
	case key == "":
		return "Key can't be blank"
	case len(key) > 255:
		return "Key is too long (maximum is 255 characters)"
	}
	for _, c := range key {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return fmt.Sprintf("Key %q can contain only letters, digits and '_'", key)
		}
	}
	return ""
}

// Variables are the variables of the dotenv reports of a job's
// dependencies, in their order, a later dependency's value of a key
// winning (GitLab appends them all; the runner keeps the last). A
// dependency without a dotenv report, or whose report expired, was erased
// or cannot be parsed (stored before reports were checked), gives none.
// BERTH_ISOLATION is left out: a job's isolation is not its
// dependencies' to choose. arts are the dependencies' artifacts, by job,
// stored in storage; log hears of reports that do not parse.
func Variables(ctx context.Context, storage artifacts.Storage, log *slog.Logger, arts map[int64][]*store.Artifact, deps []int64, now time.Time) ([]runnerapi.Variable, error) {
	var out []runnerapi.Variable
	for _, depID := range deps {
		for _, a := range arts[depID] {
			if a.Type != "dotenv" || (!a.ExpireAt.IsZero() && !a.ExpireAt.After(now)) {
				continue
			}
			vars, err := read(ctx, storage, log, a)
			if err != nil {
				return nil, err
			}
			for _, v := range vars {
				if v.Key != runnerapi.IsolationVariable {
					out = append(out, v)
				}
			}
		}
	}
	return out, nil
}

// read reads and parses a stored dotenv report; nil when it is gone or
// invalid.
func read(ctx context.Context, storage artifacts.Storage, log *slog.Logger, a *store.Artifact) ([]runnerapi.Variable, error) {
	rc, _, err := storage.Open(ctx, a.StorageKey)
	if errors.Is(err, artifacts.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening dotenv report of job %d: %w", a.JobID, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, MaxSize))
	if err != nil {
		return nil, fmt.Errorf("reading dotenv report of job %d: %w", a.JobID, err)
	}
	vars, err := Parse(data, a.Format)
	if err != nil {
		log.Warn("ignoring an invalid dotenv report", "job_id", a.JobID, "err", err)
		return nil, nil
	}
	return vars, nil
}

// Insert puts dotenv variables into a spec's variables before its
// last high ones (the project's and the pipeline's, which win over them;
// GitLab's order). A spec stored before JobSpec.HighVariables has 0: its
// dotenv variables come last.
func Insert(vars []runnerapi.Variable, high int, dotenv []runnerapi.Variable) []runnerapi.Variable {
	if len(dotenv) == 0 {
		return vars
	}
	at := len(vars) - min(max(high, 0), len(vars))
	return slices.Concat(vars[:at], dotenv, vars[at:])
}
