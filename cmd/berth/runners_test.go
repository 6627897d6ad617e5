package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/restapi"
)

// runCLI runs the berth command line in-process and returns stdout.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// realCoordinator serves an embedded coordinator on its defaults over
// HTTP for the test, and returns it with its admin token.
func realCoordinator(t *testing.T) (*httptest.Server, string) {
	t.Helper()
	srv, err := embedded.Open(context.Background(), embedded.Options{DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	admin, err := srv.EnsureAdminToken(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs, admin
}

func TestRunnersCreateAndListAgainstARealCoordinator(t *testing.T) {
	hs, admin := realCoordinator(t)

	out, err := runCLI(t, "runners", "create", "--server", hs.URL, "--admin-token", admin, "--tags", "linux,docker", "--project", "7")
	if err != nil {
		t.Fatal(err)
	}
	tok := strings.TrimSpace(out)
	if strings.Count(out, "\n") != 1 || !strings.HasPrefix(tok, "glrt-t3_") {
		t.Fatalf("runners create printed %q, want only a glrt-t3_ token", out)
	}
	out, err = runCLI(t, "runners", "list", "--server", hs.URL, "--admin-token", admin, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var list []restapi.RunnerJSON
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].RunnerType != "project_type" || strings.Join(list[0].TagList, ",") != "docker,linux" || list[0].RunUntagged {
		t.Fatalf("list %+v", list)
	}
	out, err = runCLI(t, "runners", "registration-token", "--server", hs.URL, "--admin-token", admin)
	if err != nil || !strings.HasPrefix(out, "GR1348941") {
		t.Fatalf("registration-token: %q %v", out, err)
	}
	if _, err := runCLI(t, "runners", "create", "--server", hs.URL, "--admin-token", "glpat-wrong"); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("wrong admin token: %v", err)
	}
	if _, err := runCLI(t, "runners", "create", "--server", hs.URL, "--admin-token", admin, "--project", "1", "--group", "2"); err == nil {
		t.Fatal("--project with --group accepted")
	}
}

// openCoordinator starts a coordinator with its data in dir for a test.
func openCoordinator(ctx context.Context, log *slog.Logger, dir string, cfg coordinator.Config) (*embedded.Coordinator, func(), error) {
	c, err := embedded.Open(ctx, embedded.Options{DataDir: dir, Config: cfg, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	return c, func() { c.Shutdown(context.Background()) }, nil
}
