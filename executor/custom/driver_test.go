package custom

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/config"
)

// testDriver is the one driver program of the protocol tests, run on the
// host. Its first argument is its role (config_args = ["config", …] and so
// on). Every call appends "<role>\t<arg>\t<arg>…" to $BERTH_TEST_CTL/calls
// and copies its environment to $BERTH_TEST_CTL/env.<role>; then it
// sources $BERTH_TEST_CTL/<role>.sh when a test wrote one (with $script
// and $stage set for run), and otherwise does what a host driver does:
// run runs the script and reports its non-zero exit status as a build
// failure with the code in BUILD_EXIT_CODE_FILE; the other roles do
// nothing.
const testDriver = `#!/bin/sh
ctl=$BERTH_TEST_CTL
role=$1
shift
{ printf '%s' "$role"; for a in "$@"; do printf '\t%s' "$a"; done; printf '\n'; } >>"$ctl/calls"
cat /proc/$$/environ >"$ctl/env.$role"
script= stage=
for a in "$@"; do script=$stage; stage=$a; done
if [ -f "$ctl/$role.sh" ]; then
	. "$ctl/$role.sh"
fi
if [ "$role" = run ]; then
	"$script"
	rc=$?
	if [ "$rc" -ne 0 ]; then
		echo "$rc" >"$BUILD_EXIT_CODE_FILE"
		exit "$BUILD_FAILURE_EXIT_CODE"
	fi
fi
exit 0
`

// rig is a provider with the test driver and its control directory.
type rig struct {
	t   *testing.T
	dir string // builds, cache and the driver live under it
	ctl string
	p   *Provider
	log *logRecorder
}

// rigOptions adjusts a rig's options before New.
type rigOptions func(*Options)

func newRig(t *testing.T, mods ...rigOptions) *rig {
	t.Helper()
	dir := t.TempDir()
	ctl := filepath.Join(dir, "ctl")
	if err := os.Mkdir(ctl, 0o755); err != nil {
		t.Fatal(err)
	}
	drv := filepath.Join(dir, "driver")
	if err := os.WriteFile(drv, []byte(testDriver), 0o755); err != nil {
		t.Fatal(err)
	}
	one := 1
	rec := &logRecorder{}
	o := Options{
		Config: config.Custom{
			ConfigExec: drv, ConfigArgs: []string{"config", "c-arg"},
			PrepareExec: drv, PrepareArgs: []string{"prepare", "p-arg"},
			RunExec: drv, RunArgs: []string{"run", "r-arg"},
			CleanupExec: drv, CleanupArgs: []string{"cleanup", "cl-arg"},
			GracefulKillTimeout: &one, ForceKillTimeout: &one,
		},
		BuildsDir:         filepath.Join(dir, "builds"),
		CacheDir:          filepath.Join(dir, "cache"),
		Helper:            "/opt/berth/bin/berth",
		Env:               []string{"BERTH_TEST_CTL=" + ctl},
		PrepareRetryDelay: -1,
		Logger:            slog.New(rec),
	}
	for _, m := range mods {
		m(&o)
	}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, dir: dir, ctl: ctl, p: p, log: rec}
}

// role makes the driver source body in its role r.
func (r *rig) role(role, body string) {
	r.t.Helper()
	if err := os.WriteFile(filepath.Join(r.ctl, role+".sh"), []byte(body), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// shared makes config_exec say that the builds directory is shared.
func (r *rig) shared() *rig {
	r.role("config", `echo '{"builds_dir_is_shared": true}'`+"\nexit 0\n")
	return r
}

// calls are the driver's calls so far, one "role\targs…" line each.
func (r *rig) calls() []string {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(r.ctl, "calls"))
	if err != nil && !os.IsNotExist(err) {
		r.t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// roles are the roles of the calls so far.
func (r *rig) roles() string {
	var out []string
	for _, c := range r.calls() {
		role, _, _ := strings.Cut(c, "\t")
		out = append(out, role)
	}
	return strings.Join(out, " ")
}

// env is the environment of the last call of role.
func (r *rig) env(role string) map[string]string {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(r.ctl, "env."+role))
	if err != nil {
		r.t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range bytes.Split(b, []byte{0}) {
		if k, v, ok := strings.Cut(string(e), "="); ok {
			m[k] = v
		}
	}
	return m
}

// opts are PrepareOptions of a job of project group/project.
func opts(out *testenv.SyncBuffer) executor.PrepareOptions {
	o := executor.PrepareOptions{JobID: 77, ProjectPath: "group/project", ShortToken: "abcdefghi", ConcurrencyID: 0, SystemID: "s_customtest"}
	if out != nil {
		o.Output = out
	}
	return o
}

// prepared creates and prepares an executor; its Cleanup is registered.
func (r *rig) prepared(o executor.PrepareOptions) (executor.Executor, executor.Environment) {
	r.t.Helper()
	e, err := r.p.Create(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = e.Cleanup(context.Background()) })
	env, err := e.Prepare(context.Background(), o)
	if err != nil {
		r.t.Fatalf("Prepare: %v", err)
	}
	return e, env
}

func run(e executor.Executor, stage, script string) (string, error) {
	var out testenv.SyncBuffer
	err := e.Run(context.Background(), executor.Command{Stage: stage, Script: script, Output: &out})
	return out.String(), err
}

// logRecorder is a slog.Handler keeping every record as
// "LEVEL msg key=value…".
type logRecorder struct {
	mu    sync.Mutex
	lines []string
	attrs []slog.Attr
	root  *logRecorder
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	root := h
	if h.root != nil {
		root = h.root
	}
	root.mu.Lock()
	defer root.mu.Unlock()
	root.lines = append(root.lines, b.String())
	return nil
}

func (h *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	root := h
	if h.root != nil {
		root = h.root
	}
	return &logRecorder{attrs: append(append([]slog.Attr{}, h.attrs...), as...), root: root}
}

func (h *logRecorder) WithGroup(string) slog.Handler { return h }

// has reports whether a record contains every one of parts.
func (h *logRecorder) has(parts ...string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.lines {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			return true
		}
	}
	return false
}

func (h *logRecorder) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.lines, "\n")
}

// countLines counts the lines of s that start with prefix.
func countLines(lines []string, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// readLines reads a file's lines ("" → none).
func readLines(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}
