package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/internal/testenv"
)

// vmCoordinator is an embedded coordinator on loopback for the microVM
// end-to-end tests, shut down with the test, and its admin.
func vmCoordinator(t *testing.T, dir string) (srv *embedded.Coordinator, admin *client.Client, adminTok string) {
	t.Helper()
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err = embedded.Open(ctx, embedded.Options{DataDir: filepath.Join(dir, "coordinator"), Listener: ln,
		Logger: slog.New(slog.DiscardHandler), Config: coordinator.Config{LongPollTimeout: 5 * time.Second, TraceUpdateInterval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	if adminTok, err = srv.EnsureAdminToken(ctx, ""); err != nil {
		t.Fatal(err)
	}
	return srv, client.New(srv.URL, adminTok), adminTok
}

// vmRunner starts `berth runner run` with one microvm [[runners]] entry
// named name (TCG, 256 MiB VMs of debugTestImage, a state directory of
// its own, images in dir/images), stopped with the test; its output is
// logged when the test failed.
func vmRunner(t *testing.T, berth, dir, name, url, token string) {
	t.Helper()
	state, err := os.MkdirTemp("", "bvr") // short: VM socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	cfgPath := filepath.Join(dir, name+".toml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
concurrent = 1
check_interval = 1
[[runners]]
  name = %q
  url = %q
  token = %q
  executor = "microvm"
  [runners.microvm]
    image = %q
    [runners.microvm.nesting_config]
      accel = "tcg"
      memory_mb = 256
      state_dir = %q
      image_dir = %q
`, name, url, token, debugTestImage, state, filepath.Join(dir, "images"))), 0o600)
	manager := exec.Command(berth, "runner", "run", "-c", cfgPath)
	out := &testenv.SyncBuffer{}
	manager.Stdout, manager.Stderr = out, out
	if err := manager.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		manager.Process.Signal(os.Interrupt)
		manager.Wait()
		if t.Failed() {
			t.Logf("runner %s:\n%s", name, out.String())
		}
	})
}
