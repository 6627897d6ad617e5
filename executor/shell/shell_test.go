package shell_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// openToAll makes dir and the directories above it, up to the system's
// temporary directory, traversable by every user.
func openToAll(t *testing.T, dir string) {
	t.Helper()
	for d := dir; strings.HasPrefix(d, os.TempDir()+string(filepath.Separator)); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// The runner's user setting: as root, a job's stages run as that user
// (its HOME, USER…), in directories it owns, with the runner's own files
// out of its reach; the stages that move files run as the user too (not
// in the runner's process). As another user than root, it is refused.
func TestRunAsUser(t *testing.T) {
	testenv.LookPath(t, "bash")
	if os.Geteuid() != 0 {
		dir := t.TempDir()
		e, _ := shell.New(shell.Config{DefaultBuildsDir: dir, DefaultCacheDir: dir, Helper: "/bin/true"}).Create(t.Context())
		defer e.Cleanup(t.Context())
		if _, err := e.Prepare(t.Context(), executor.PrepareOptions{ProjectPath: "g/p", ShortToken: "tok", User: "root"}); err == nil ||
			!strings.Contains(err.Error(), "needs the runner to run as root") {
			t.Fatalf("as another user without root: %v", err)
		}
		testenv.Root(t)
	}
	dir := t.TempDir()
	openToAll(t, dir)
	secret := filepath.Join(dir, "runner-only")
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := shell.New(shell.Config{DefaultBuildsDir: filepath.Join(dir, "builds"), DefaultCacheDir: filepath.Join(dir, "cache"), Helper: "/bin/true"})
	e, _ := p.Create(t.Context())
	defer e.Cleanup(t.Context())
	env, err := e.Prepare(t.Context(), executor.PrepareOptions{ProjectPath: "g/p", ShortToken: "tok", User: "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	if env.Local {
		t.Error("the environment is Local: the runner would move the user's files as root")
	}
	var out testenv.SyncBuffer
	err = e.Run(t.Context(), executor.Command{Stage: "step_script", Output: &out, Script: `id -u; echo "home=$HOME user=$USER logname=$LOGNAME"
touch made; mkdir -p "$PWD.tmp/x"; cat ` + secret + ` 2>/dev/null || echo cannot-read`})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"65534\n", "home=/nonexistent user=nobody logname=nobody", "cannot-read"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	for _, f := range []string{filepath.Join(env.BuildDir, "made"), env.BuildDir, env.TmpDir, env.CacheDir, filepath.Join(dir, "builds", "tok")} {
		if st, err := os.Stat(f); err != nil || st.Sys().(*syscall.Stat_t).Uid != 65534 {
			t.Errorf("%s: %v, want it nobody's", f, err)
		}
	}

	// The user's own name, or none, switches nothing.
	e2, _ := p.Create(t.Context())
	defer e2.Cleanup(t.Context())
	if env, err := e2.Prepare(t.Context(), executor.PrepareOptions{ProjectPath: "g/q", ShortToken: "tok", User: "root"}); err != nil || !env.Local {
		t.Errorf("as root for root: %+v %v", env, err)
	}
	e3, _ := p.Create(t.Context())
	defer e3.Cleanup(t.Context())
	if _, err := e3.Prepare(t.Context(), executor.PrepareOptions{ProjectPath: "g/r", ShortToken: "tok", User: "no-such-user-berth"}); err == nil ||
		!strings.Contains(err.Error(), `user "no-such-user-berth"`) {
		t.Errorf("an unknown user: %v", err)
	}
}
