package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/ci"
)

// TestCorpus lints real-world-shaped configurations (testdata/corpus/*:
// repo/ is the repository, mirror/ the --include-dir, args the ref and
// variables) and checks the job graph against want.txt, written by hand
// from GitLab's documented semantics: stage, job, when (allow_failure),
// needs, one line per job in pipeline order. Each file uses many features
// at once, the way projects write them.
func TestCorpus(t *testing.T) {
	cases, err := filepath.Glob("testdata/corpus/*")
	if err != nil || len(cases) == 0 {
		t.Fatalf("no corpus cases: %v", err)
	}
	for _, dir := range cases {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			args, err := os.ReadFile(filepath.Join(dir, "args"))
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(filepath.Join(dir, "want.txt"))
			if err != nil {
				t.Fatal(err)
			}
			repo := filepath.Join(dir, "repo")
			lint := []string{"--json", "--root", repo}
			mirror := filepath.Join(dir, "mirror")
			if _, err := os.Stat(mirror); err == nil {
				lint = append(lint, "--include-dir", mirror)
			}
			lint = append(lint, strings.Fields(string(args))...)
			out, err := runLint(t, append(lint, filepath.Join(repo, ".gitlab-ci.yml"))...)
			var res struct {
				Valid    bool `json:"valid"`
				Errors   []lintError
				Warnings []lintError
				Pipeline *ci.Pipeline `json:"pipeline"`
				// Unresolved includes would make the graph incomplete.
				Unresolved []json.RawMessage `json:"unresolved_includes"`
			}
			if jerr := json.Unmarshal([]byte(out), &res); jerr != nil {
				t.Fatalf("lint output is not JSON (%v, lint error %v):\n%s", jerr, err, out)
			}
			if !res.Valid {
				t.Fatalf("rejected: %+v", res.Errors)
			}
			if len(res.Unresolved) > 0 {
				t.Fatalf("unresolved includes: %s", res.Unresolved)
			}
			if got := renderGraph(res.Pipeline); got != string(want) {
				t.Errorf("graph differs\n--- got\n%s--- want\n%s", got, want)
			}
		})
	}
}

// renderGraph prints a pipeline the way want.txt files are written.
func renderGraph(p *ci.Pipeline) string {
	if !p.Created {
		return "not created\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "created\nstages: %s\n", strings.Join(p.Stages, ", "))
	for _, j := range p.Jobs {
		when := string(j.When)
		if j.When == ci.Delayed {
			when += " " + j.StartIn.String()
		}
		switch {
		case j.AllowFailure:
			when += "(allow_failure)"
		case len(j.AllowFailureExitCodes) > 0:
			codes := make([]string, len(j.AllowFailureExitCodes))
			for i, c := range j.AllowFailureExitCodes {
				codes[i] = fmt.Sprint(c)
			}
			when += "(exit_codes " + strings.Join(codes, ",") + ")"
		}
		needs := "-"
		if j.Scheduling == ci.ScheduleDAG {
			var n []string
			for _, x := range j.Needs {
				n = append(n, x.Job)
			}
			needs = "[" + strings.Join(n, ", ") + "]"
		}
		fmt.Fprintf(&b, "%s %s %s %s\n", j.Stage, j.Name, when, needs)
	}
	return b.String()
}
