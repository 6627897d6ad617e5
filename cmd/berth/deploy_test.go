package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/restapi"
)

// TestReleasesEnvironmentsDeploymentsList runs a pipeline that releases
// and deploys on a real coordinator, then lists what it made.
func TestReleasesEnvironmentsDeploymentsList(t *testing.T) {
	url, admin, _ := cliCoordinator(t, "")

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
	common := []string{"--server", url, "--admin-token", admin, "--project", "grp/app"}
	out, err := runCLI(t, "pipelines", "create", "--server", url, "--admin-token", admin, "--project", "grp/app", dir)
	if err != nil {
		t.Fatalf("pipelines create: %v", err)
	}
	if out, err := runCLI(t, "pipelines", "wait", strings.TrimSpace(out), "--interval", "10ms", "--server", url, "--admin-token", admin); err != nil {
		t.Fatalf("pipelines wait: %v\n%s", err, out)
	}

	out, err = runCLI(t, append([]string{"releases", "list"}, common...)...)
	if err != nil || !strings.Contains(out, "TAG") || !strings.Contains(out, "v1.0.0") || !strings.Contains(out, "First") {
		t.Errorf("releases list: %v\n%s", err, out)
	}
	out, err = runCLI(t, append([]string{"releases", "list", "--json"}, common...)...)
	var rels []restapi.ReleaseJSON
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
	var ds []restapi.DeploymentJSON
	if err != nil || json.Unmarshal([]byte(out), &ds) != nil || len(ds) != 1 || ds[0].Deployable.Name != "deploy" {
		t.Errorf("deployments list --json: %v %+v\n%s", err, ds, out)
	}

	if _, err := runCLI(t, "releases", "list", "--server", url, "--admin-token", admin); err == nil {
		t.Error("releases list without --project succeeded")
	}
	if _, err := runCLI(t, "deployments", "list", "--server", url, "--admin-token", admin, "--project", "nope"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("deployments of a missing project: %v", err)
	}
}
