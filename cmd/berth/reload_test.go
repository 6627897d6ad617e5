package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner"
	"github.com/berthci/berth/runner/config"
)

// TestWatchConfig: berth runner run's watch reloads config.toml when it
// changes and on SIGHUP; a file that does not load is reported with its
// line and changes nothing; log_level applies at once.
func TestWatchConfig(t *testing.T) {
	hs, admin := realCoordinator(t)
	c := client.New(hs.URL, admin)
	r, err := c.CreateRunner(t.Context(), restapi.CreateRunnerRequest{RunnerType: "instance_type", RunUntagged: new(true)})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	write := func(concurrent int, extra string) {
		t.Helper()
		body := fmt.Sprintf("concurrent = %d\ncheck_interval = 1\n%s\n[[runners]]\nname = \"a\"\nurl = %q\ntoken = %q\nexecutor = \"shell\"\nbuilds_dir = %q\n",
			concurrent, extra, hs.URL, r.Token, filepath.Join(dir, "builds"))
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(1, `log_level = "info"`)
	loaded, _ := os.ReadFile(path)
	cfg, _, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	log, level := runnerLoggerVar(&logs, "text", cfg.LogLevel)
	m, err := runner.New(cfg, runner.Options{Logger: log, NewProvider: newProvider(t.Context(), log), ConfigPath: path, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = m.Close(context.Background())
	})
	// SIGHUP must not end the test process before the watch listens.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go watchConfig(ctx, m, configWatch{path: path, level: level, every: 20 * time.Millisecond, loaded: loaded}, log)

	waitLog := func(what, want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(logs.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the log lacks %q:\n%s", what, want, logs.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	write(3, `log_level = "debug"`)
	waitLog("a changed file", "config.toml reloaded")
	waitLog("the new concurrent", "concurrent=3")
	if level.Level() != slog.LevelDebug {
		t.Errorf("log level %v after log_level = debug", level.Level())
	}

	write(2, "concurrent_typo = [")
	waitLog("a broken file", "config.toml not reloaded")
	if !strings.Contains(logs.String(), "config.toml:") {
		t.Errorf("the refusal does not say where:\n%s", logs.String())
	}

	// SIGHUP reloads even an unchanged file.
	write(4, `log_level = "debug"`)
	waitLog("the fixed file", "concurrent=4")
	n := strings.Count(logs.String(), "config.toml reloaded")
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(logs.String(), "config.toml reloaded") == n {
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP did not reload")
		}
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
