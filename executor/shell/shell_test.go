package shell_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// A stage's script reaches the shell whole, however long, and leaves
// nothing in the job's temporary directory; commands that read stdin do
// not read the script.
func TestLongScriptsAndStdin(t *testing.T) {
	for _, sh := range []string{"bash", "sh"} {
		t.Run(sh, func(t *testing.T) {
			testenv.LookPath(t, sh)
			dir := t.TempDir()
			p := shell.New(shell.Config{DefaultBuildsDir: dir, DefaultCacheDir: dir, Helper: "/bin/true"})
			e, _ := p.Create(t.Context())
			defer e.Cleanup(t.Context())
			env, err := e.Prepare(t.Context(), executor.PrepareOptions{ProjectPath: "g/p", ShortToken: "tok", Shell: sh})
			if err != nil {
				t.Fatal(err)
			}
			var script strings.Builder
			for i := range 4000 {
				fmt.Fprintf(&script, "V%d='%s'\n", i, strings.Repeat("x", 40))
			}
			script.WriteString("cat >/dev/null || true\necho \"last $V3999\"\n")
			var out strings.Builder
			if err := e.Run(t.Context(), executor.Command{Stage: "step_script", Script: script.String(), Output: &out}); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			if want := "last " + strings.Repeat("x", 40) + "\n"; out.String() != want {
				t.Errorf("output %q, want %q", out.String(), want)
			}
			if left, _ := os.ReadDir(env.TmpDir); len(left) != 0 {
				t.Errorf("the stage left %v in the temporary directory", left)
			}
		})
	}
}
