package microvm

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/config"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/nesting/qemu"
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
