package ci

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/fstest"
)

// files builds an in-memory repository; keys are paths, values contents.
func files(kv ...string) fstest.MapFS {
	m := fstest.MapFS{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = &fstest.MapFile{Data: []byte(kv[i+1])}
	}
	return m
}

// compileYAML compiles one .gitlab-ci.yml (plus extra files).
func compileYAML(t *testing.T, yml string, env Env, extra ...string) (*Pipeline, error) {
	t.Helper()
	fsys := files(append([]string{".gitlab-ci.yml", yml}, extra...)...)
	return Compile(context.Background(), Source{FS: fsys}, env)
}

func mustCompile(t *testing.T, yml string, env Env, extra ...string) *Pipeline {
	t.Helper()
	p, err := compileYAML(t, yml, env, extra...)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return p
}

// compileErrors compiles and returns the error lines; it fails the test
// when the configuration is valid or the error is not an ErrorList.
func compileErrors(t *testing.T, yml string, env Env, extra ...string) []string {
	t.Helper()
	_, err := compileYAML(t, yml, env, extra...)
	if err == nil {
		t.Fatalf("Compile succeeded, want errors")
	}
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("error is %T (%v), want ErrorList", err, err)
	}
	return strings.Split(list.Error(), "\n")
}

func jobNames(jobs []*Job) []string {
	out := []string{}
	for _, j := range jobs {
		out = append(out, j.Name)
	}
	return out
}

func branch(b string) Env {
	return Env{Predefined: map[string]string{"CI_COMMIT_BRANCH": b, "CI_COMMIT_REF_NAME": b, "CI_PIPELINE_SOURCE": "push"}}
}
