package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/internal/testenv"
)

// TestQuickStartRelativeData runs the README's quick start as written: a
// server on a relative --data directory, a runner token, two pushes of a
// directory and a clone (issue 9, defect 2: git http-backend was handed
// the relative path and found no repository).
func TestQuickStartRelativeData(t *testing.T) {
	testenv.LookPath(t, "git")
	t.Chdir(t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- serve(ctx, slog.New(slog.DiscardHandler), ln, serverOptions{Data: "./berth-data", ShutdownTimeout: 5 * time.Second})
	}()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("server: %v", err)
		}
	}()
	// Opening a new data directory generates an RSA key for ID tokens:
	// under -race on a loaded machine it has taken over ten
	// seconds, so the wait is bounded by the server ending, not by a count.
	var admin []byte
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if admin, err = os.ReadFile("berth-data/admin-token"); err == nil && len(admin) > 0 {
			break
		}
		select {
		case serr := <-served:
			served <- serr
			t.Fatalf("the server ended before writing ./berth-data/admin-token: %v", serr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server wrote no admin token under ./berth-data in 2 minutes: %v", err)
		}
	}
	url := "http://" + ln.Addr().String()
	common := []string{"--server", url, "--admin-token", strings.TrimSpace(string(admin))}
	if _, err := runCLI(t, append([]string{"runners", "create", "--tags", "linux", "--run-untagged"}, common...)...); err != nil {
		t.Fatalf("runners create: %v", err)
	}
	src := filepath.Join(t.TempDir(), "src")
	os.MkdirAll(src, 0o755)
	for i, body := range []string{"one", "two"} {
		if err := os.WriteFile(filepath.Join(src, ".gitlab-ci.yml"), []byte("job:\n  script: [echo "+body+"]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := runCLI(t, append([]string{"pipelines", "create", "--project", "grp/proj", src}, common...)...); err != nil {
			t.Fatalf("push %d: %v (%q)", i+1, err, out)
		}
	}
	clone := filepath.Join(t.TempDir(), "clone")
	cmd := exec.Command("git", "clone", "-q", strings.Replace(url, "http://", "http://x:"+common[3]+"@", 1)+"/grp/proj.git", clone)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(clone, ".gitlab-ci.yml")); err != nil || !strings.Contains(string(b), "two") {
		t.Errorf("clone has %q %v, want the second push", b, err)
	}
	for path, want := range map[string]os.FileMode{"berth-data": 0o700, "berth-data/berth.db": 0o600, "berth-data/variables.key": 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
		} else if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
}
