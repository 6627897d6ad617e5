package ci

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzCompile feeds arbitrary bytes to the YAML front end. The input is the
// main file; if it contains a line "#---", what follows is also served as
// inc.yml so includes are fuzzed too. Compile must never panic, must
// report configuration problems only as positioned errors, and a compiled
// pipeline must be internally consistent.
func FuzzCompile(f *testing.F) {
	_ = filepath.WalkDir("testdata", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(p, ".yml") || strings.HasSuffix(p, ".yaml")) {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
		return nil
	})
	for _, s := range []string{
		"include: inc.yml\na:\n  script: x\n#---\nb:\n  script: y\n  needs: [a]\n",
		"a: &a\n  script: [x]\nb:\n  <<: *a\n  parallel: {matrix: [{A: [1, 2]}]}\nc:\n  script: x\n  needs: [{job: b, parallel: {matrix: [{A: 1}]}}]\n",
		"a:\n  script: x\n  rules:\n    - if: '$A =~ /x/i && ($B || $C != \"d\")'\n      when: manual\n",
		".x: &x [a, [b, [c]]]\nj:\n  script: *x\n",
		"j:\n  script: !reference [.t, script]\n.t:\n  script: [a]\n",
		"a:\n  script: x\n  only:\n    refs: [main, '/^rel-\\d+$/i', branches@g/p]\n    variables: [$A == \"x\"]\n    changes: [a/*]\nb:\n  script: x\n  except: [tags, schedules]\n",
		"j:\n  script: x\n  id_tokens: {T: {aud: a}}\n  secrets:\n    G: {gcp_secret_manager: {name: n, version: 2}, token: $T}\n    A: {azure_key_vault: {name: n}}\n    W: {aws_secrets_manager: 'a#b'}\n    H: {aws_secrets_manager: {secret_id: s, region: r}}\n",
		"default:\n  id_tokens:\n    T:\n      aud: [a, $B]\nj:\n  script: x\n  secrets:\n    S:\n      vault: a/b/c@kv\n      file: false\n    L:\n      vault: {engine: {name: kv-v1, path: s}, path: p, field: f}\n      token: $T\n",
		"default:\n  isolation: container\nvariables:\n  BERTH_ISOLATION: vm\nj:\n  script: x\n  isolation: microvm\n  parallel: {matrix: [{BERTH_ISOLATION: [none, instance]}]}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		main, inc, _ := bytes.Cut(data, []byte("\n#---\n"))
		fsys := files(".gitlab-ci.yml", string(main), "inc.yml", string(inc))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		env := Env{
			Predefined: map[string]string{"CI_COMMIT_BRANCH": "main", "A": "x"},
			Exists:     FSExists(fsys),
			Changes:    func(context.Context, ChangesQuery) (bool, error) { return true, nil },
			CacheKey:   func(context.Context, []string, bool) (string, error) { return "k", nil },
			Limits:     Limits{MaxNodes: 200_000, MaxJobs: 2000},
		}
		p, err := Compile(ctx, Source{FS: fsys}, env)
		if err != nil {
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("non-configuration error: %v", err)
			}
			if len(list) == 0 {
				t.Fatal("empty ErrorList")
			}
			for _, e := range list {
				if e.Pos.File == "" || e.Pos.Line < 1 || e.Pos.Col < 1 || e.Msg == "" {
					t.Fatalf("error without a position: %#v", e)
				}
			}
			return
		}
		names := map[string]bool{}
		for _, j := range p.Jobs {
			if names[j.Name] {
				t.Fatalf("duplicate job %q", j.Name)
			}
			names[j.Name] = true
			if j.StageIndex < 0 || j.StageIndex >= len(p.Stages) || p.Stages[j.StageIndex] != j.Stage {
				t.Fatalf("job %q has stage %q at %d", j.Name, j.Stage, j.StageIndex)
			}
			if _, err := j.RunnerPayload(time.Hour); err != nil {
				t.Fatalf("payload of %q: %v", j.Name, err)
			}
			if j.Isolation != "" && j.Isolation.Rank() < 0 {
				t.Fatalf("job %q asks for unknown isolation level %q", j.Name, j.Isolation)
			}
		}
		for _, j := range p.Jobs {
			for _, n := range j.Needs {
				if !names[n.Job] {
					t.Fatalf("job %q needs %q, which is not in the pipeline", j.Name, n.Job)
				}
			}
			for _, d := range j.Dependencies {
				if !names[d] {
					t.Fatalf("job %q depends on %q, which is not in the pipeline", j.Name, d)
				}
			}
		}
	})
}
