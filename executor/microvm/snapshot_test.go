package microvm

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/nesting/qemu"
	"github.com/berthci/berth/runnerapi"
)

// TestSnapshotFromADaemonElsewhere: with nesting_host, the job's VM lives
// in another nesting daemon (here `berth nesting serve`'s server on a
// socket, on QEMU); the executor's snapshot comes over Berth's Snapshots
// service and is a bundle of that VM, with the job's directory and
// environment.
func TestSnapshotFromADaemonElsewhere(t *testing.T) {
	needVMs(t)
	berth := testenv.Berth(t)
	images.once.Do(func() { images.dir, _ = os.MkdirTemp("", "microvm-test-images-") })
	state, err := os.MkdirTemp("", "bs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	sock := filepath.Join(state, "nesting.sock")
	l, err := nesting.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- nesting.NewServer(qemu.New(log), log).Serve(ctx, l) }()
	t.Cleanup(func() { stop(); <-served }) // after the executor's and the provider's

	p, err := New(Options{Config: config.MicroVM{NestingHost: "unix://" + sock, NestingConfig: map[string]any{
		"accel": "tcg", "memory_mb": 256, "state_dir": filepath.Join(state, "d"), "image_dir": images.dir, "agent": berth}}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Shutdown(context.Background()) })
	e, env, _ := prepared(t, p, executor.PrepareOptions{Job: busyboxJob()})
	runScript(t, e, "echo made-before-the-snapshot > "+env.BuildDir+"/evidence")
	var bundle bytes.Buffer
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := e.Snapshot(sctx, executor.SnapshotOptions{JobID: 9, Point: "on_failure", Env: []string{"GREETING=hi"}}, &bundle); err != nil {
		t.Fatal(err)
	}
	// The VM runs on.
	if out := runScript(t, e, "cat "+env.BuildDir+"/evidence"); !strings.Contains(out, "made-before-the-snapshot") {
		t.Errorf("the VM after its snapshot: %q", out)
	}
	dir := t.TempDir()
	meta, err := qemu.ReadBundle(&bundle, dir)
	if err != nil {
		t.Fatal(err)
	}
	if meta.VM != e.VM().ID || meta.Job.ID != 9 || meta.Job.Dir != env.BuildDir || !strings.Contains(strings.Join(meta.Job.Env, " "), "GREETING=hi") {
		t.Errorf("bundle meta %+v: want VM %s, job 9 in %s with GREETING", meta, e.VM().ID, env.BuildDir)
	}
}

// TestPrepareFromSnapshot: a job's VM, snapshotted with a file in its
// build directory and a process it left, is resumed by another runner's
// daemon as a new job's environment: the snapshotted job's directories
// and shell, the file and the process, under the new VM's host name.
func TestPrepareFromSnapshot(t *testing.T) {
	p := newTestProvider(t, config.MicroVM{}, Options{})
	e, env, _ := prepared(t, p, executor.PrepareOptions{Job: busyboxJob()})
	var out bytes.Buffer
	if err := e.Run(context.Background(), executor.Command{Stage: "step_script", KeepProcesses: true, Output: &out,
		Script: "echo made-before > " + env.BuildDir + "/evidence; (setsid sleep 31337 </dev/null >/dev/null 2>&1 &)"}); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	var bundle bytes.Buffer
	if err := e.Snapshot(context.Background(), executor.SnapshotOptions{JobID: 5, Point: "on_failure"}, &bundle); err != nil {
		t.Fatal(err)
	}

	bundleBytes := bytes.Clone(bundle.Bytes())
	other := newTestProvider(t, config.MicroVM{}, Options{})
	r, renv, log := prepared(t, other, executor.PrepareOptions{Job: busyboxJob(), Snapshot: &bundle})
	if !strings.Contains(log, "Creating a microVM from a snapshot of job 5 (on_failure)...") {
		t.Errorf("Prepare's output %q: want the snapshot's job and point", log)
	}
	want := env
	want.Hostname = r.VM().ID
	if !reflect.DeepEqual(renv, want) || renv.Hostname == env.Hostname {
		t.Errorf("environment from the snapshot %+v, want %+v", renv, want)
	}
	// A runner whose allowed_images lacks the snapshot's image does not
	// resume it (the VM it made goes with Cleanup).
	strict := newTestProvider(t, config.MicroVM{AllowedImages: []string{"allowed/*"}}, Options{})
	se, _ := strict.Create(context.Background())
	job := busyboxJob()
	job.Image = &runnerapi.Image{Name: "allowed/image"}
	_, err := se.Prepare(context.Background(), executor.PrepareOptions{Job: job, ShortToken: "abcdefghi", ProjectPath: "g/p", Snapshot: bytes.NewReader(bundleBytes)})
	if !errors.Is(err, executor.ErrNotAllowed) || !strings.Contains(err.Error(), "allowed_images") {
		t.Errorf("a snapshot of an image not in allowed_images: %v", err)
	}
	if err := se.Cleanup(context.Background()); err != nil {
		t.Errorf("Cleanup: %v", err)
	}
	got := runScript(t, r, `cat "$PWD/evidence"; hostname; for f in /proc/[0-9]*/cmdline; do case "$(tr '\0' ' ' < $f)" in "sleep 31337"*) echo still-running;; esac; done`)
	if !strings.Contains(got, "made-before") || !strings.Contains(got, "still-running") || !strings.Contains(got, r.VM().ID) {
		t.Errorf("in the VM from the snapshot: %q, want the file, the process and host name %s", got, r.VM().ID)
	}
}

// TestPrepareFromSnapshotRefused: a daemon elsewhere (nesting_host)
// cannot resume a snapshot (ErrNoSnapshots, before it is dialled), nor
// can a job start from a snapshot and a branch point at once.
func TestPrepareFromSnapshotRefused(t *testing.T) {
	p, err := New(Options{Config: config.MicroVM{NestingHost: "unix:///nonexistent/nesting.sock"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	for name, c := range map[string]struct {
		o    executor.PrepareOptions
		want error
		text string
	}{
		"nesting_host": {executor.PrepareOptions{Snapshot: strings.NewReader("bundle")}, executor.ErrNoSnapshots, "only the runner's own nesting daemon resumes snapshots"},
		"both":         {executor.PrepareOptions{Snapshot: strings.NewReader("bundle"), Branch: &vmBranch{p: p}}, nil, "both a branch point and a snapshot"},
	} {
		e, _ := p.Create(context.Background())
		c.o.Job, c.o.ShortToken, c.o.ProjectPath = busyboxJob(), "abcdefghi", "g/p"
		_, err := e.Prepare(context.Background(), c.o)
		if err == nil || c.want != nil && !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%s: Prepare = %v; want %v with %q", name, err, c.want, c.text)
		}
		if err := e.Cleanup(context.Background()); err != nil {
			t.Errorf("%s: Cleanup: %v", name, err)
		}
	}
}
