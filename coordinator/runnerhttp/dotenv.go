package runnerhttp

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
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
	// MaxDotenvSize bounds the uploaded dotenv artifact as stored (the
	// gzip the runner sends): it must be smaller.
	MaxDotenvSize = 5 * 1024
	// MaxDotenvVariables bounds the number of variables of a report.
	MaxDotenvVariables = 20
	// maxDotenvText bounds the decompressed text, which GitLab does not
	// (a 5 KB gzip can hold megabytes).
	maxDotenvText = 1 << 20
)

// DotenvError is what is wrong with a dotenv report; Line is 1-based in
// the file (the gzip member) it is in, 0 when the error is not a line's.
type DotenvError struct {
	Line int
	Msg  string
}

func (e *DotenvError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("dotenv line %d: %s", e.Line, e.Msg)
	}
	return "dotenv: " + e.Msg
}

// ParseDotenvArtifact parses a stored dotenv report of a format (gzip,
// as the runner uploads it, possibly several members, one a file; or
// raw) the way GitLab's Ci::ParseDotenvArtifactService does: each line
// is KEY=VALUE, split at the first '=', both sides trimmed of whitespace;
// no empty lines, comments or quoting (quotes stay part of the value); a
// key of letters, digits and '_' (at most 255); a key given again keeps
// its first place and takes the last value; at most MaxDotenvVariables
// variables. UTF-16LE text (with its BOM) is converted, a UTF-8 BOM
// dropped, invalid UTF-8 replaced. The variables are not raw: the runner
// expands them.
func ParseDotenvArtifact(data []byte, format string) ([]runnerapi.Variable, error) {
	var texts [][]byte
	switch format {
	case "gzip":
		// As documented for gzip.Reader.Multistream: a bytes.Reader is a
		// ByteReader, so each Reset starts exactly at the next member.
		br := bytes.NewReader(data)
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, &DotenvError{Msg: "not a gzip file: " + err.Error()}
		}
		total := 0
		for {
			zr.Multistream(false)
			b, err := io.ReadAll(io.LimitReader(zr, int64(maxDotenvText-total+1)))
			if err != nil {
				return nil, &DotenvError{Msg: "reading gzip: " + err.Error()}
			}
			if total += len(b); total > maxDotenvText {
				return nil, &DotenvError{Msg: fmt.Sprintf("larger than %d bytes decompressed", maxDotenvText)}
			}
			texts = append(texts, b)
			if err := zr.Reset(br); err == io.EOF {
				break
			} else if err != nil {
				return nil, &DotenvError{Msg: "reading gzip: " + err.Error()}
			}
		}
	case "raw":
		texts = [][]byte{data}
	default:
		return nil, &DotenvError{Msg: fmt.Sprintf("artifact_format must be gzip, not %q", format)}
	}
	var vars []runnerapi.Variable
	index := map[string]int{}
	for _, text := range texts {
		for n, line := range strings.SplitAfter(dotenvText(text), "\n") {
			if line == "" {
				continue // after the last newline
			}
			key, value, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "=")
			if !ok {
				return nil, &DotenvError{Line: n + 1, Msg: "Invalid Format: want KEY=VALUE (no empty lines or comments)"}
			}
			key, value = strings.Trim(key, dotenvSpace), strings.Trim(value, dotenvSpace)
			if msg := dotenvKeyProblem(key); msg != "" {
				return nil, &DotenvError{Line: n + 1, Msg: msg}
			}
			if i, ok := index[key]; ok {
				vars[i].Value = value
				continue
			}
			index[key] = len(vars)
			vars = append(vars, runnerapi.Variable{Key: key, Value: value})
		}
	}
	if len(vars) > MaxDotenvVariables {
		return nil, &DotenvError{Msg: fmt.Sprintf("Dotenv files cannot have more than %d variables", MaxDotenvVariables)}
	}
	return vars, nil
}

// dotenvSpace is what Ruby's String#strip removes.
const dotenvSpace = " \t\n\v\f\r\x00"

// dotenvText is a file's text as UTF-8, as GitLab reads it: UTF-16LE
// (by its BOM) converted, a UTF-8 BOM dropped, invalid bytes replaced.
func dotenvText(b []byte) string {
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

// dotenvKeyProblem says what is wrong with a key, GitLab's rule for
// variable keys; empty if nothing.
func dotenvKeyProblem(key string) string {
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

// dotenvVariables are the variables of the dotenv reports of a job's
// dependencies, in their order, a later dependency's value of a key
// winning (GitLab appends them all; the runner keeps the last). A
// dependency without a dotenv report, or whose report expired, was erased
// or cannot be parsed (stored before reports were checked), gives none.
// BERTH_ISOLATION is left out: a job's isolation is not its
// dependencies' to choose. arts are the dependencies' artifacts, by job.
func (s *API) dotenvVariables(ctx context.Context, arts map[int64][]*store.Artifact, deps []int64, now time.Time) ([]runnerapi.Variable, error) {
	var out []runnerapi.Variable
	for _, depID := range deps {
		for _, a := range arts[depID] {
			if a.Type != "dotenv" || (!a.ExpireAt.IsZero() && !a.ExpireAt.After(now)) {
				continue
			}
			vars, err := s.readDotenv(ctx, a)
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

// readDotenv reads and parses a stored dotenv report; nil when it is gone
// or invalid.
func (s *API) readDotenv(ctx context.Context, a *store.Artifact) ([]runnerapi.Variable, error) {
	rc, _, err := s.artifacts.Open(ctx, a.StorageKey)
	if errors.Is(err, artifacts.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening dotenv report of job %d: %w", a.JobID, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, MaxDotenvSize))
	if err != nil {
		return nil, fmt.Errorf("reading dotenv report of job %d: %w", a.JobID, err)
	}
	vars, err := ParseDotenvArtifact(data, a.Format)
	if err != nil {
		s.log.Warn("ignoring an invalid dotenv report", "job_id", a.JobID, "err", err)
		return nil, nil
	}
	return vars, nil
}

// withDotenv puts dotenv variables into a spec's variables before its
// last high ones (the project's and the pipeline's, which win over them;
// GitLab's order). A spec stored before JobSpec.HighVariables has 0: its
// dotenv variables come last.
func withDotenv(vars []runnerapi.Variable, high int, dotenv []runnerapi.Variable) []runnerapi.Variable {
	if len(dotenv) == 0 {
		return vars
	}
	at := len(vars) - min(max(high, 0), len(vars))
	return slices.Concat(vars[:at], dotenv, vars[at:])
}
