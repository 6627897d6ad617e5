package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/client"
)

// TestReleasesEnvironmentsDeploymentsList runs a pipeline that releases
// and deploys on a real coordinator, then lists what it made.
func TestReleasesEnvironmentsDeploymentsList(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed: ", err)
	}
	srv, closeSrv, err := openCoordinator(context.Background(), slog.New(slog.DiscardHandler), t.TempDir(), coordinator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer closeSrv()
	admin, err := srv.EnsureAdminToken(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	c := client.New(hs.URL, admin)
	rn, err := c.CreateRunner(context.Background(), coordinator.CreateRunnerRequest{RunnerType: "instance_type"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); fakeRunner(ctx, t, hs.URL, rn.Token) }()
	defer func() { stop(); srv.Close(); <-done }()

	dir := t.TempDir()
	ci := `
deploy:
  stage: deploy
  script: [deploy]
  environment:
    name: production
    url: https://example.test
release:
  stage: deploy
  script: [release]
  release:
    tag_name: v1.0.0
    name: First
    description: The first release
`
	if err := os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte(ci), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"--server", hs.URL, "--admin-token", admin, "--project", "grp/app"}
	out, err := runCLI(t, "pipelines", "create", "--server", hs.URL, "--admin-token", admin, "--project", "grp/app", dir)
	if err != nil {
		t.Fatalf("pipelines create: %v", err)
	}
	if out, err := runCLI(t, "pipelines", "wait", strings.TrimSpace(out), "--interval", "10ms", "--server", hs.URL, "--admin-token", admin); err != nil {
		t.Fatalf("pipelines wait: %v\n%s", err, out)
	}

	out, err = runCLI(t, append([]string{"releases", "list"}, common...)...)
	if err != nil || !strings.Contains(out, "TAG") || !strings.Contains(out, "v1.0.0") || !strings.Contains(out, "First") {
		t.Errorf("releases list: %v\n%s", err, out)
	}
	out, err = runCLI(t, append([]string{"releases", "list", "--json"}, common...)...)
	var rels []coordinator.ReleaseJSON
	if err != nil || json.Unmarshal([]byte(out), &rels) != nil || len(rels) != 1 || rels[0].Description != "The first release" {
		t.Errorf("releases list --json: %v %+v\n%s", err, rels, out)
	}

	out, err = runCLI(t, append([]string{"environments", "list"}, common...)...)
	if err != nil || !strings.Contains(out, "production") || !strings.Contains(out, "available") || !strings.Contains(out, "https://example.test") {
		t.Errorf("environments list: %v\n%s", err, out)
	}
	out, err = runCLI(t, append([]string{"environments", "list", "--json", "--state", "stopped"}, common...)...)
	if err != nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("environments list --state stopped: %v %q", err, out)
	}

	out, err = runCLI(t, append([]string{"deployments", "list"}, common...)...)
	if err != nil || !strings.Contains(out, "production") || !strings.Contains(out, "success") || !strings.Contains(out, "deploy (") {
		t.Errorf("deployments list: %v\n%s", err, out)
	}
	out, err = runCLI(t, append([]string{"deployments", "list", "--json", "--environment", "production", "--status", "success"}, common...)...)
	var ds []coordinator.DeploymentJSON
	if err != nil || json.Unmarshal([]byte(out), &ds) != nil || len(ds) != 1 || ds[0].Deployable.Name != "deploy" {
		t.Errorf("deployments list --json: %v %+v\n%s", err, ds, out)
	}

	if _, err := runCLI(t, "releases", "list", "--server", hs.URL, "--admin-token", admin); err == nil {
		t.Error("releases list without --project succeeded")
	}
	if _, err := runCLI(t, "deployments", "list", "--server", hs.URL, "--admin-token", admin, "--project", "nope"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("deployments of a missing project: %v", err)
	}
}
