package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting/fleetingtest"
)

func runFleeting(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := newFleetingCmd()
	cmd.SilenceUsage, cmd.SilenceErrors = true, true // as under the root command
	var out, errb bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetIn(strings.NewReader(stdin))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	if errb.Len() > 0 {
		t.Logf("stderr of %v: %s", args, errb.String())
	}
	return out.String(), err
}

// TestFleetingCLI drives the local plugin binary through the operator CLI:
// create an instance, list it, run commands on it, delete it.
func TestFleetingCLI(t *testing.T) {
	bin := fleetingtest.BuildPlugin(t, "github.com/berthci/berth/cmd/fleeting-plugin-local")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "fleeting.toml")
	conf := "plugin = \"" + bin + "\"\n[plugin_config]\nstate_dir = \"" + filepath.Join(dir, "state") + "\"\nmax_instances = 2\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { runFleeting(t, "", "decrease", "--config", cfg, "local-1") })

	out, err := runFleeting(t, "", "increase", "--config", cfg, "1")
	if err != nil || !strings.Contains(out, "1 of 1 requested") {
		t.Fatalf("increase: %q, %v", out, err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		out, err = runFleeting(t, "", "instances", "--config", cfg, "--addresses")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "local-1  running  127.77.") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("instances: %q", out)
		}
		time.Sleep(50 * time.Millisecond)
	}

	out, err = runFleeting(t, "from stdin", "exec", "--config", cfg, "local-1", "--", "cat; echo; exit 3")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 3 || out != "from stdin\n" {
		t.Fatalf("exec: output %q, error %v; want the stdin echoed and exit status 3", out, err)
	}
	if _, err := runFleeting(t, "", "exec", "--config", cfg, "nope", "--", "true"); err == nil {
		t.Fatal("exec on an unknown instance succeeded")
	}

	out, err = runFleeting(t, "", "decrease", "--config", cfg, "local-1")
	if err != nil || strings.TrimSpace(out) != "local-1" {
		t.Fatalf("decrease: %q, %v", out, err)
	}
}

func TestFleetingList(t *testing.T) {
	bin := fleetingtest.BuildPlugin(t, "github.com/berthci/berth/cmd/fleeting-plugin-fake")
	t.Setenv("PATH", filepath.Dir(bin))
	out, err := runFleeting(t, "", "list", "--plugin-dir", t.TempDir())
	if err != nil || !strings.Contains(strings.Join(strings.Fields(out), " "), "fleeting-plugin-fake dev path "+bin) {
		t.Fatalf("list: %q, %v", out, err)
	}
}

func TestFleetingInstancesNeedsPlugin(t *testing.T) {
	if _, err := runFleeting(t, "", "instances"); err == nil || !strings.Contains(err.Error(), "no plugin") {
		t.Fatalf("instances without a plugin: %v", err)
	}
}
