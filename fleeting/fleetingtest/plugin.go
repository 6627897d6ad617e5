package fleetingtest

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting/host"
)

// BuildPlugin compiles the main package pkg (an import path) into
// t.TempDir() and returns the binary's path. Go's build cache makes repeated
// builds cheap.
func BuildPlugin(t testing.TB, pkg string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), path.Base(pkg))
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// TestLogger logs to t until the test ends; later records (from
// goroutines still winding down) are dropped.
func TestLogger(t testing.TB) *slog.Logger {
	w := &writer{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type writer struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

// StartPlugin starts binary through the host with config marshalled as
// plugin_config and closes it when the test ends.
func StartPlugin(t testing.TB, binary string, config any) *host.Plugin {
	t.Helper()
	raw, err := json.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := host.Start(ctx, host.Config{Plugin: binary, PluginConfig: raw, Logger: TestLogger(t)})
	if err != nil {
		t.Fatalf("starting plugin %s: %v", binary, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}
