package shell_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/executortest"
	"github.com/berthci/berth/executor/shell"
	"github.com/berthci/berth/internal/testenv"
)

func TestConformance(t *testing.T) {
	testenv.LookPath(t, "bash")
	testenv.LookPath(t, "sleep")
	executortest.Run(t, executortest.Config{
		NewProvider: func(t *testing.T, dir string) executor.Provider {
			return shell.New(shell.Config{
				DefaultBuildsDir: filepath.Join(dir, "builds"),
				DefaultCacheDir:  filepath.Join(dir, "cache"),
				Helper:           "/bin/true",
				KillGrace:        200 * time.Millisecond,
			})
		},
	})
}

func TestShSelectedWhenAsked(t *testing.T) {
	testenv.LookPath(t, "sh")
	dir := t.TempDir()
	p := shell.New(shell.Config{DefaultBuildsDir: dir, DefaultCacheDir: dir, Helper: "/bin/true"})
	e, _ := p.Create(t.Context())
	defer e.Cleanup(t.Context())
	env, err := e.Prepare(t.Context(), executor.PrepareOptions{ProjectPath: "g/p", ShortToken: "tok", Shell: "sh"})
	if err != nil || env.Shell != "sh" {
		t.Fatalf("%+v %v", env, err)
	}
	if _, err := p.Create(t.Context()); err != nil {
		t.Fatal(err)
	}
	e2, _ := p.Create(t.Context())
	defer e2.Cleanup(t.Context())
	if _, err := e2.Prepare(t.Context(), executor.PrepareOptions{ProjectPath: "g/p", ShortToken: "tok", Shell: "pwsh"}); err == nil {
		t.Fatal("pwsh accepted")
	}
}
