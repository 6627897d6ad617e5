//go:build unix

package slotcgroup

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The scripts run here against fake cgroup trees: plain directories and
// files in t.TempDir(), with BERTH_CGROUP_ROOT pointing at them. A fake tree
// has none of the kernel's files, so each test creates what the kernel would
// show and checks what the script wrote. Every script runs with /bin/sh
// (dash on Debian), with bash and, when busybox is installed, with busybox
// sh and a PATH holding nothing but busybox applets, so a script that needs
// more than POSIX sh and busybox basics fails there.

// shell is a way to run a script.
type shell struct {
	name string
	argv []string // the script is appended
	env  []string // added to the environment
}

// shells returns /bin/sh and, when installed, bash and busybox sh.
func shells(t *testing.T) []shell {
	t.Helper()
	list := []shell{{name: "sh", argv: []string{"/bin/sh", "-c"}}}
	if bash, err := exec.LookPath("bash"); err == nil {
		list = append(list, shell{name: "bash", argv: []string{bash, "-c"}})
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Log("busybox not installed: scripts run with /bin/sh only")
		return list
	}
	bin := t.TempDir()
	for _, applet := range []string{"sh", "cat", "mkdir", "rmdir", "sleep", "kill", "printf", "echo", "test", "["} {
		if err := os.Symlink(bb, filepath.Join(bin, applet)); err != nil {
			t.Fatal(err)
		}
	}
	return append(list, shell{name: "busybox", argv: []string{bb, "sh", "-c"}, env: []string{"PATH=" + bin}})
}

// result is what a script did.
type result struct {
	stdout, stderr string
	code           int // exit status; -1 when killed by a signal
}

// run runs script with sh and the cgroup root root ("" leaves
// BERTH_CGROUP_ROOT unset, so the script uses /sys/fs/cgroup).
func run(t *testing.T, sh shell, root, script string) result {
	t.Helper()
	// Not t.Context(): cleanups run scripts too, after it is canceled.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, sh.argv[0], append(sh.argv[1:], script)...)
	cmd.WaitDelay = 5 * time.Second // a background process keeping stdout open
	cmd.Env = environ(root, sh.env...)
	cmd.Dir = t.TempDir()
	// Its own process group: a script that wrongly kills "0" (its group)
	// must not take the test binary with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("%s: running script: %v", sh.name, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("%s: script timed out; stderr: %s", sh.name, r.stderr)
	}
	return r
}

// environ is the test's environment without BERTH_CGROUP_ROOT, with root
// (when not "") and extra ("KEY=value", replacing the test's KEY).
func environ(root string, extra ...string) []string {
	if root != "" {
		extra = append(extra, "BERTH_CGROUP_ROOT="+root)
	}
	drop := map[string]bool{"BERTH_CGROUP_ROOT": true}
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		drop[k] = true
	}
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !drop[k] {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// mustRun runs script and fails the test unless it exits 0 with nothing on
// stderr.
func mustRun(t *testing.T, sh shell, root, script string) string {
	t.Helper()
	r := run(t, sh, root, script)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("%s: exit %d, stderr:\n%s", sh.name, r.code, r.stderr)
	}
	return r.stdout
}

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatalf("reading %s: %v", name, err)
	}
	return string(b)
}

// wantFiles checks file contents under dir; a want of "<absent>" means the
// file must not exist.
func wantFiles(t *testing.T, dir string, want map[string]string) {
	t.Helper()
	for name, w := range want {
		p := filepath.Join(dir, name)
		b, err := os.ReadFile(p)
		switch {
		case w == "<absent>":
			if !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s exists (%q, %v), want it absent", name, b, err)
			}
		case err != nil:
			t.Errorf("%s: %v", name, err)
		case string(b) != w:
			t.Errorf("%s = %q, want %q", name, b, w)
		}
	}
}

const slot0 = "gitlab-runner/slot-0"

var fullLimits = Limits{CPUs: "1.5", Memory: "512m", Pids: 64}

// fakeV2 makes a cgroup v2 root offering cpu, memory and pids, with
// gitlab-runner/ existing already and having memory enabled below it.
func fakeV2(t *testing.T) string {
	root := t.TempDir()
	write(t, filepath.Join(root, "cgroup.controllers"), "cpuset cpu io memory hugetlb pids rdma misc\n")
	write(t, filepath.Join(root, "cgroup.subtree_control"), "")
	write(t, filepath.Join(root, "gitlab-runner", "cgroup.controllers"), "cpu memory pids\n")
	write(t, filepath.Join(root, "gitlab-runner", "cgroup.subtree_control"), "memory\n")
	return root
}

// fakeV1 makes a cgroup v1 root as Debian mounts it: a joint cpu,cpuacct
// hierarchy with links cpu and cpuacct, memory, pids, freezer, and blkio,
// which slot cgroups do not use.
func fakeV1(t *testing.T) string {
	root := t.TempDir()
	for _, c := range []string{"cpu,cpuacct", "memory", "pids", "freezer", "blkio"} {
		mkdir(t, filepath.Join(root, c))
	}
	for _, l := range []string{"cpu", "cpuacct"} {
		if err := os.Symlink("cpu,cpuacct", filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestSetupV2(t *testing.T) {
	for _, sh := range shells(t) {
		root := fakeV2(t)
		mustRun(t, sh, root, SetupScript(slot0, fullLimits))
		wantFiles(t, root, map[string]string{
			"cgroup.subtree_control":               "+cpu +memory +pids\n",
			"gitlab-runner/cgroup.subtree_control": "+cpu +pids\n", // memory was enabled already
			"gitlab-runner/slot-0/cpu.max":         "150000 100000\n",
			"gitlab-runner/slot-0/memory.max":      "536870912\n",
			"gitlab-runner/slot-0/pids.max":        "64\n",
			// The slot itself must stay a leaf that processes can join.
			"gitlab-runner/slot-0/cgroup.subtree_control": "<absent>",
			// No swap file: the kernel has no swap accounting; not created.
			"gitlab-runner/slot-0/memory.swap.max": "<absent>",
		})

		// As the kernel shows it: enabled controllers are not written again.
		write(t, filepath.Join(root, "cgroup.subtree_control"), "cpu memory pids\n")
		write(t, filepath.Join(root, "gitlab-runner/slot-0/memory.swap.max"), "max\n")
		mustRun(t, sh, root, SetupScript(slot0, fullLimits))
		wantFiles(t, root, map[string]string{
			"cgroup.subtree_control":               "cpu memory pids\n",
			"gitlab-runner/slot-0/memory.swap.max": "0\n",
		})

		// A slot reused without limits gets none.
		mustRun(t, sh, root, SetupScript(slot0, Limits{}))
		wantFiles(t, root, map[string]string{
			"gitlab-runner/slot-0/cpu.max":         "max 100000\n",
			"gitlab-runner/slot-0/memory.max":      "max\n",
			"gitlab-runner/slot-0/memory.swap.max": "max\n",
			"gitlab-runner/slot-0/pids.max":        "max\n",
		})

		// Only controllers the parent offers are enabled; a deeper path
		// creates every level.
		root = t.TempDir()
		write(t, filepath.Join(root, "cgroup.controllers"), "cpu pids\n")
		mustRun(t, sh, root, SetupScript("a/b/c", Limits{Pids: 5}))
		wantFiles(t, root, map[string]string{
			"cgroup.subtree_control": "+cpu +pids\n",
			"a/b/c/pids.max":         "5\n",
			"a/b/c/cpu.max":          "<absent>", // not reset: nothing to reset
			"a/b/c/memory.max":       "<absent>",
		})
	}
}

func TestSetupV1(t *testing.T) {
	for _, sh := range shells(t) {
		root := fakeV1(t)
		// With swap accounting the kernel shows memsw; the test shows it.
		write(t, filepath.Join(root, "memory", slot0, "memory.memsw.limit_in_bytes"), "9223372036854771712\n")
		mustRun(t, sh, root, SetupScript(slot0, fullLimits))
		wantFiles(t, root, map[string]string{
			"cpu,cpuacct/gitlab-runner/slot-0/cpu.cfs_quota_us":       "150000\n",
			"cpu,cpuacct/gitlab-runner/slot-0/cpu.cfs_period_us":      "100000\n",
			"memory/gitlab-runner/slot-0/memory.limit_in_bytes":       "536870912\n",
			"memory/gitlab-runner/slot-0/memory.memsw.limit_in_bytes": "536870912\n",
			"pids/gitlab-runner/slot-0/pids.max":                      "64\n",
			"cpu,cpuacct/gitlab-runner/slot-0/memory.limit_in_bytes":  "<absent>",
			"memory/gitlab-runner/slot-0/memory.swap.max":             "<absent>",
			"memory/gitlab-runner/slot-0/cgroup.subtree_control":      "<absent>",
			"freezer/gitlab-runner/slot-0/freezer.state":              "<absent>",
			"blkio/gitlab-runner":                                     "<absent>",
		})
		if fi, err := os.Stat(filepath.Join(root, "freezer", slot0)); err != nil || !fi.IsDir() {
			t.Errorf("%s: freezer cgroup not created: %v", sh.name, err)
		}

		mustRun(t, sh, root, SetupScript(slot0, Limits{}))
		wantFiles(t, root, map[string]string{
			"cpu,cpuacct/gitlab-runner/slot-0/cpu.cfs_quota_us":       "-1\n",
			"memory/gitlab-runner/slot-0/memory.limit_in_bytes":       "-1\n",
			"memory/gitlab-runner/slot-0/memory.memsw.limit_in_bytes": "-1\n",
			"pids/gitlab-runner/slot-0/pids.max":                      "max\n",
		})

		// Separate cpu and cpuacct mounts, as on this kind of host too.
		root = t.TempDir()
		for _, c := range []string{"cpu", "cpuacct", "memory"} {
			mkdir(t, filepath.Join(root, c))
		}
		mustRun(t, sh, root, SetupScript(slot0, Limits{CPUs: "0.5", Memory: "64m"}))
		wantFiles(t, root, map[string]string{
			"cpu/gitlab-runner/slot-0/cpu.cfs_quota_us":               "50000\n",
			"memory/gitlab-runner/slot-0/memory.limit_in_bytes":       "67108864\n",
			"cpuacct/gitlab-runner/slot-0/cpu.cfs_quota_us":           "<absent>",
			"memory/gitlab-runner/slot-0/memory.memsw.limit_in_bytes": "<absent>",
		})
	}
}

func TestSetupFails(t *testing.T) {
	for _, sh := range shells(t) {
		for _, tc := range []struct {
			name   string
			root   func() string
			path   string
			l      Limits
			errHas []string
		}{
			{"invalid limits", func() string { return fakeV2(t) }, slot0, Limits{CPUs: "lots", Pids: -1},
				[]string{"berth: slot cgroup gitlab-runner/slot-0: invalid limits: cpus:", "pids:"}},
			{"write fails", func() string {
				r := fakeV2(t)
				mkdir(t, filepath.Join(r, slot0, "memory.max")) // a directory cannot be written
				return r
			}, slot0, fullLimits, []string{"writing \"536870912\" to ", "/gitlab-runner/slot-0/memory.max"}},
			{"mkdir fails", func() string {
				r := fakeV1(t)
				write(t, filepath.Join(r, "memory", "gitlab-runner"), "a file")
				return r
			}, slot0, fullLimits, []string{"creating ", "/memory/gitlab-runner/slot-0"}},
			{"no hierarchy", func() string { return t.TempDir() }, slot0, Limits{}, []string{"no cgroup hierarchy under"}},
			{"no v1 memory", func() string {
				r := t.TempDir()
				mkdir(t, filepath.Join(r, "pids"))
				return r
			}, slot0, Limits{Memory: "1g"}, []string{"memory: no cgroup v1 memory hierarchy"}},
			{"no v1 cpu", func() string {
				r := t.TempDir()
				mkdir(t, filepath.Join(r, "memory"))
				return r
			}, slot0, Limits{CPUs: "1"}, []string{"cpus: no cgroup v1 cpu hierarchy"}},
			{"no v1 pids", func() string {
				r := t.TempDir()
				mkdir(t, filepath.Join(r, "memory"))
				return r
			}, slot0, Limits{Pids: 3}, []string{"pids: no cgroup v1 pids hierarchy"}},
			{"empty path", func() string { return fakeV2(t) }, "", Limits{}, []string{"not a relative cgroup path"}},
			{"dot-dot path", func() string { return fakeV2(t) }, "a/../..", Limits{}, []string{"not a relative cgroup path"}},
		} {
			root := tc.root()
			r := run(t, sh, root, SetupScript(tc.path, tc.l))
			if r.code != 1 {
				t.Errorf("%s/%s: exit %d, want 1 (stderr %q)", sh.name, tc.name, r.code, r.stderr)
			}
			for _, s := range tc.errHas {
				if !strings.Contains(r.stderr, s) {
					t.Errorf("%s/%s: stderr %q, want it to contain %q", sh.name, tc.name, r.stderr, s)
				}
			}
			if r.stdout != "" {
				t.Errorf("%s/%s: stdout %q", sh.name, tc.name, r.stdout)
			}
		}
	}
}

// TestScriptsQuote runs every script with a path no template may produce,
// full of shell syntax: the scripts must treat it as one literal path.
func TestScriptsQuote(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "pwned")
	odd := `we'ird dir/$(touch ` + marker + `) "x" ` + "`touch " + marker + "`" + `/slot *0`
	for _, sh := range shells(t) {
		root := fakeV1(t)
		mustRun(t, sh, root, SetupScript(odd, Limits{Memory: "64m"}))
		wantFiles(t, filepath.Join(root, "memory", odd), map[string]string{"memory.limit_in_bytes": "67108864\n"})
		pid := mustRun(t, sh, root, EnterScript(odd)+"echo $$\n")
		wantFiles(t, filepath.Join(root, "pids", odd), map[string]string{"cgroup.procs": pid})
		write(t, filepath.Join(root, "memory", odd, "memory.oom_control"), "oom_kill 7\n")
		if got := mustRun(t, sh, root, OOMKillsScript(odd)); got != "7\n" {
			t.Errorf("%s: OOM kills %q", sh.name, got)
		}
		mustRun(t, sh, root, KillScript(odd))
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("%s: the path was executed", sh.name)
		}
		// Remove needs empty directories: drop the fake files first.
		for _, c := range []string{"cpu,cpuacct", "memory", "pids", "freezer"} {
			d := filepath.Join(root, c, odd)
			entries, _ := os.ReadDir(d)
			for _, e := range entries {
				os.Remove(filepath.Join(d, e.Name()))
			}
		}
		mustRun(t, sh, root, RemoveScript(odd))
		if _, err := os.Stat(filepath.Join(root, "memory", odd)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: not removed: %v", sh.name, err)
		}
		if _, err := os.Stat(filepath.Join(root, "memory", "we'ird dir")); err != nil {
			t.Errorf("%s: the parent was removed: %v", sh.name, err)
		}
	}
}

func TestEnter(t *testing.T) {
	// After the script: the pid the stage's shell sees, and whether the
	// script's variables leaked into the stage.
	const probe = "echo $$\necho \"${berth_root-unset} ${berth_path-unset}\"\n"
	for _, sh := range shells(t) {
		root := fakeV2(t)
		mustRun(t, sh, root, SetupScript(slot0, Limits{}))
		out := strings.Split(mustRun(t, sh, root, EnterScript(slot0)+probe), "\n")
		wantFiles(t, filepath.Join(root, slot0), map[string]string{"cgroup.procs": out[0] + "\n"})
		if out[1] != "unset unset" {
			t.Errorf("%s: variables leak into the stage: %q", sh.name, out[1])
		}

		root = fakeV1(t)
		mustRun(t, sh, root, SetupScript(slot0, Limits{}))
		pid := strings.SplitN(mustRun(t, sh, root, EnterScript(slot0)+probe), "\n", 2)[0] + "\n"
		wantFiles(t, root, map[string]string{
			"cpu,cpuacct/gitlab-runner/slot-0/cgroup.procs": pid,
			"memory/gitlab-runner/slot-0/cgroup.procs":      pid,
			"pids/gitlab-runner/slot-0/cgroup.procs":        pid,
			"freezer/gitlab-runner/slot-0/cgroup.procs":     pid,
			"blkio/gitlab-runner":                           "<absent>",
		})

		// No slot cgroup: the stage must not run unconfined.
		for _, root := range []string{fakeV2(t), fakeV1(t), t.TempDir()} {
			r := run(t, sh, root, EnterScript("gitlab-runner/slot-9")+"echo stage ran\n")
			if r.code != 1 || strings.Contains(r.stdout, "stage ran") || !strings.Contains(r.stderr, "berth: slot cgroup gitlab-runner/slot-9: ") {
				t.Errorf("%s: entering a missing cgroup under %s: %+v", sh.name, root, r)
			}
		}
	}
}

// sleeper is a process the test starts and reaps, to be listed in a fake
// cgroup.
type sleeper struct {
	cmd  *exec.Cmd
	done chan error
}

func startSleeper(t *testing.T) *sleeper {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &sleeper{cmd: cmd, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	return s
}

func (s *sleeper) pid() string { return strconv.Itoa(s.cmd.Process.Pid) }

// killed fails the test unless the sleeper died of SIGKILL.
func (s *sleeper) killed(t *testing.T, what string) {
	t.Helper()
	select {
	case err := <-s.done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("%s: sleeper ended with %v, want SIGKILL", what, err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("%s: sleeper %s still running", what, s.pid())
	}
}

func TestKill(t *testing.T) {
	for _, sh := range shells(t) {
		for _, tc := range []struct {
			name  string
			root  func(*testing.T) string
			procs func(root string) []string // cgroup.procs files of the slot and its children
			after map[string]string
		}{
			{"v2 without cgroup.kill", fakeV2, func(r string) []string {
				return []string{filepath.Join(r, slot0, "cgroup.procs"), filepath.Join(r, slot0, "docker-1.scope", "cgroup.procs")}
			}, map[string]string{"gitlab-runner/slot-0/cgroup.kill": "<absent>"}},
			{"v2 with cgroup.kill", func(t *testing.T) string {
				r := fakeV2(t)
				write(t, filepath.Join(r, slot0, "cgroup.kill"), "")
				return r
			}, func(r string) []string { return []string{filepath.Join(r, slot0, "cgroup.procs")} },
				map[string]string{"gitlab-runner/slot-0/cgroup.kill": "1\n"}},
			{"v1 with freezer", fakeV1, func(r string) []string {
				return []string{filepath.Join(r, "memory", slot0, "cgroup.procs"), filepath.Join(r, "pids", slot0, "child", "cgroup.procs"),
					// Only in a hierarchy slot cgroups do not use: a container runtime put it there.
					filepath.Join(r, "blkio", slot0, "cgroup.procs")}
			}, map[string]string{"freezer/gitlab-runner/slot-0/freezer.state": "THAWED\n"}},
			{"v1 without freezer", func(t *testing.T) string {
				r := t.TempDir()
				mkdir(t, filepath.Join(r, "memory"))
				return r
			}, func(r string) []string { return []string{filepath.Join(r, "memory", slot0, "cgroup.procs")} }, nil},
		} {
			root := tc.root(t)
			mustRun(t, sh, root, SetupScript(slot0, Limits{}))
			var victims []*sleeper
			for _, f := range tc.procs(root) {
				a, b := startSleeper(t), startSleeper(t)
				victims = append(victims, a, b)
				// Also a pid 0 (a process of another pid namespace), garbage,
				// and a pid that does not exist: all to be skipped.
				write(t, f, a.pid()+"\n0\nx1\n"+b.pid()+"\n4194304\n")
			}
			neighbour := startSleeper(t)
			write(t, filepath.Join(root, "gitlab-runner", "slot-1", "cgroup.procs"), neighbour.pid()+"\n")

			start := time.Now()
			mustRun(t, sh, root, KillScript(slot0))
			for _, v := range victims {
				v.killed(t, sh.name+"/"+tc.name)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("%s/%s: took %v", sh.name, tc.name, d)
			}
			if err := neighbour.cmd.Process.Signal(syscall.Signal(0)); err != nil {
				t.Errorf("%s/%s: the neighbour slot's process was hit: %v", sh.name, tc.name, err)
			}
			wantFiles(t, root, tc.after)
		}
	}
}

func TestKillNothing(t *testing.T) {
	for _, sh := range shells(t) {
		for _, root := range []string{fakeV2(t), fakeV1(t), t.TempDir(), filepath.Join(t.TempDir(), "absent")} {
			if r := run(t, sh, root, KillScript(slot0)); r.code != 0 || r.stderr != "" || r.stdout != "" {
				t.Errorf("%s: killing a missing cgroup under %s: %+v", sh.name, root, r)
			}
		}
	}
}

// TestKillSparesItself lists the script's own shell in the cgroup: it must
// neither kill nor freeze itself.
func TestKillSparesItself(t *testing.T) {
	for _, sh := range shells(t) {
		root := fakeV1(t)
		mustRun(t, sh, root, SetupScript(slot0, Limits{}))
		victim := startSleeper(t)
		script := `for f in "$BERTH_CGROUP_ROOT"/freezer/` + slot0 + ` "$BERTH_CGROUP_ROOT"/memory/` + slot0 + `; do
	echo $$ > "$f/cgroup.procs"
	echo ` + victim.pid() + ` >> "$f/cgroup.procs"
done
` + KillScript(slot0)
		mustRun(t, sh, root, script)
		victim.killed(t, sh.name)
		wantFiles(t, root, map[string]string{"freezer/gitlab-runner/slot-0/freezer.state": "<absent>"})
	}
}

// TestKillGivesUp lists a process that cannot go away (a zombie nobody
// reaps yet): the script must fail after about 10 s, naming it.
func TestKillGivesUp(t *testing.T) {
	sh := shells(t)[0]
	root := fakeV2(t)
	mustRun(t, sh, root, SetupScript(slot0, Limits{}))
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	defer zombie.Wait()
	pid := strconv.Itoa(zombie.Process.Pid)
	write(t, filepath.Join(root, slot0, "cgroup.procs"), pid+"\n")
	start := time.Now()
	r := run(t, sh, root, KillScript(slot0))
	if d := time.Since(start); d < 9*time.Second || d > 20*time.Second {
		t.Errorf("gave up after %v, want about 10 s", d)
	}
	if r.code != 1 || !strings.Contains(r.stderr, "processes still in the cgroup after 10 s: "+pid) {
		t.Errorf("%+v", r)
	}
}

func TestOOMKills(t *testing.T) {
	v2events := "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"
	for _, sh := range shells(t) {
		for _, tc := range []struct {
			name  string
			files map[string]string
			want  string
		}{
			{"v2", map[string]string{"cgroup.controllers": "", slot0 + "/memory.events": v2events}, "2\n"},
			{"v2 child counted by the kernel already", map[string]string{
				"cgroup.controllers": "", slot0 + "/memory.events": v2events, slot0 + "/c/memory.events": v2events}, "2\n"},
			{"v2 no memory controller", map[string]string{"cgroup.controllers": "", slot0 + "/cgroup.procs": ""}, "0\n"},
			{"v2 no slot", map[string]string{"cgroup.controllers": ""}, "0\n"},
			{"v1 slot and children", map[string]string{
				"memory/" + slot0 + "/memory.oom_control":          "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
				"memory/" + slot0 + "/docker-1/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
				"memory/" + slot0 + "/docker-2/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
				"memory/gitlab-runner/slot-1/memory.oom_control":   "oom_kill 50\n",
			}, "4\n"},
			{"v1 old kernel", map[string]string{"memory/" + slot0 + "/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n"}, "0\n"},
			{"v1 no trailing newline", map[string]string{"memory/" + slot0 + "/memory.oom_control": "oom_kill 5"}, "5\n"},
			{"v1 no slot", map[string]string{"memory/cgroup.procs": ""}, "0\n"},
			{"nothing", nil, "0\n"},
		} {
			root := t.TempDir()
			for name, content := range tc.files {
				write(t, filepath.Join(root, name), content)
			}
			if got := mustRun(t, sh, root, OOMKillsScript(slot0)); got != tc.want {
				t.Errorf("%s/%s: %q, want %q", sh.name, tc.name, got, tc.want)
			}
		}
	}
}

func TestRemove(t *testing.T) {
	for _, sh := range shells(t) {
		// v1: the slot in our hierarchies (through the links too), a child
		// cgroup, a hierarchy we do not use, and the neighbour slot.
		root := fakeV1(t)
		for _, d := range []string{"memory/" + slot0 + "/docker-1", "cpu,cpuacct/" + slot0, "freezer/" + slot0, "blkio/" + slot0, "memory/gitlab-runner/slot-1"} {
			mkdir(t, filepath.Join(root, d))
		}
		mustRun(t, sh, root, RemoveScript(slot0))
		for _, c := range []string{"memory", "cpu,cpuacct", "freezer", "blkio", "pids"} {
			if _, err := os.Stat(filepath.Join(root, c, slot0)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: %s/%s left: %v", sh.name, c, slot0, err)
			}
		}
		if _, err := os.Stat(filepath.Join(root, "memory/gitlab-runner/slot-1")); err != nil {
			t.Errorf("%s: the neighbour slot was removed: %v", sh.name, err)
		}
		// Absent: nothing to do.
		mustRun(t, sh, root, RemoveScript(slot0))

		// v2.
		root = fakeV2(t)
		mkdir(t, filepath.Join(root, slot0, "child"))
		mustRun(t, sh, root, RemoveScript(slot0))
		if _, err := os.Stat(filepath.Join(root, slot0)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: v2 slot left: %v", sh.name, err)
		}
		if _, err := os.Stat(filepath.Join(root, "gitlab-runner")); err != nil {
			t.Errorf("%s: the parent was removed: %v", sh.name, err)
		}

		// Busy (here: not empty) for good: fail after a short retry,
		// naming the directory.
		write(t, filepath.Join(root, slot0, "cgroup.procs"), "1\n")
		r := run(t, sh, root, RemoveScript(slot0))
		if r.code != 1 || !strings.Contains(r.stderr, "removing "+filepath.Join(root, slot0)+": ") {
			t.Errorf("%s: removing a busy cgroup: %+v", sh.name, r)
		}
	}
}

// TestScriptsJoin joins scripts as the executors do (one sh -s session):
// each must let the next run, and none may read standard input, which is
// where sh -s reads the rest of the script from.
func TestScriptsJoin(t *testing.T) {
	for _, sh := range shells(t) {
		root := fakeV2(t)
		write(t, filepath.Join(root, slot0, "memory.events"), "oom 2\noom_kill 2\n")
		if got := mustRun(t, sh, root, SetupScript(slot0, fullLimits)+"\n"+OOMKillsScript(slot0)); got != "2\n" {
			t.Errorf("%s: setup, then OOM kills: %q", sh.name, got)
		}
		victim := startSleeper(t)
		write(t, filepath.Join(root, slot0, "cgroup.procs"), victim.pid()+"\n")

		argv := append(slices.Clone(sh.argv[:len(sh.argv)-1]), "-s") // "-c" → "-s"
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = environ(root, sh.env...)
		cmd.Stdin = strings.NewReader(SetupScript(slot0, Limits{Pids: 9}) + "\n" + OOMKillsScript(slot0) + "\n" +
			KillScript(slot0) + "\n" + OOMKillsScript(slot0) + "\n" + EnterScript(slot0) + "echo entered\n")
		out, err := cmd.Output()
		if err != nil || string(out) != "2\n2\nentered\n" {
			t.Errorf("%s: sh -s: setup, OOM kills, kill, OOM kills, enter: %q, %v", sh.name, out, err)
		}
		wantFiles(t, filepath.Join(root, slot0), map[string]string{"pids.max": "9\n"})
		victim.killed(t, sh.name)

		// Remove needs empty directories: drop the fake files first.
		entries, _ := os.ReadDir(filepath.Join(root, slot0))
		for _, e := range entries {
			os.Remove(filepath.Join(root, slot0, e.Name()))
		}
		if got := mustRun(t, sh, root, KillScript(slot0)+"\n"+RemoveScript(slot0)+"\necho removed\n"); got != "removed\n" {
			t.Errorf("%s: kill, then remove: %q", sh.name, got)
		}
		if _, err := os.Stat(filepath.Join(root, slot0)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: not removed: %v", sh.name, err)
		}
	}
}
