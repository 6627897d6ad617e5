package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/restapi"
)

func TestSchedulesAgainstARealCoordinator(t *testing.T) {
	hs, admin := realCoordinator(t)
	flags := []string{"--server", hs.URL, "--admin-token", admin}
	if _, err := client.New(hs.URL, admin).CreateProject(t.Context(), restapi.CreateProjectRequest{Path: "acme/web"}); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, append([]string{"schedules", "create", "acme/web", "--description", "nightly", "--ref", "main",
		"--cron", "0 2 * * 1-5", "--timezone", "Asia/Tokyo", "--var", "SUITE=full", "--var", "EMPTY="}, flags...)...)
	if err != nil || !strings.HasPrefix(out, `schedule 1 (active): nightly on main, "0 2 * * 1-5" in Asia/Tokyo, next run 20`) {
		t.Fatalf("create: %q %v", out, err)
	}
	if _, err := runCLI(t, append([]string{"schedules", "create", "acme/web", "--description", "x", "--ref", "main", "--cron", "0 2 * *"}, flags...)...); err == nil || !strings.Contains(err.Error(), "want 5 fields") {
		t.Errorf("a cron of four fields: %v", err)
	}
	if _, err := runCLI(t, append([]string{"schedules", "create", "acme/web", "--description", "x", "--ref", "main", "--cron", "@daily", "--var", "NOVALUE"}, flags...)...); err == nil || !strings.Contains(err.Error(), "KEY=VALUE") {
		t.Errorf("--var without =: %v", err)
	}
	// Pause it and change a variable: the other flags stay.
	if out, err := runCLI(t, append([]string{"schedules", "update", "acme/web", "1", "--active=false", "--var", "SUITE=smoke"}, flags...)...); err != nil || !strings.Contains(out, "(paused): nightly on main") {
		t.Fatalf("update: %q %v", out, err)
	}
	out = mustCLI(t, append([]string{"schedules", "show", "acme/web", "1", "--json"}, flags...)...)
	var ps restapi.PipelineScheduleJSON
	if err := json.Unmarshal([]byte(out), &ps); err != nil {
		t.Fatal(err)
	}
	if ps.Active || ps.Cron != "0 2 * * 1-5" || ps.Variables == nil || len(*ps.Variables) != 2 || (*ps.Variables)[0].Value != "smoke" || (*ps.Variables)[1].Key != "EMPTY" {
		t.Errorf("after update: %+v variables %v", ps, ps.Variables)
	}
	if out := mustCLI(t, append([]string{"schedules", "show", "acme/web", "1"}, flags...)...); strings.Contains(out, "smoke") || !strings.Contains(out, "variable SUITE (env_var)") {
		t.Errorf("show prints variable values, or not their names: %q", out)
	}
	out = mustCLI(t, append([]string{"schedules", "list", "acme/web", "--scope", "inactive", "--json"}, flags...)...)
	var list []restapi.PipelineScheduleJSON
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].ID != 1 {
		t.Errorf("list --scope inactive: %q %v", out, err)
	}
	if out := mustCLI(t, append([]string{"schedules", "list", "acme/web", "--scope", "active", "--json"}, flags...)...); strings.TrimSpace(out) != "[]" {
		t.Errorf("list --scope active: %q", out)
	}
	// Play reaches the coordinator, which finds no branch to run in an
	// empty project.
	if _, err := runCLI(t, append([]string{"schedules", "play", "acme/web", "1"}, flags...)...); err == nil || !strings.Contains(err.Error(), "Reference not found") {
		t.Errorf("play in an empty project: %v", err)
	}
	if _, err := runCLI(t, append([]string{"schedules", "play", "acme/web", "x"}, flags...)...); err == nil || !strings.Contains(err.Error(), "positive number") {
		t.Errorf("play with a bad id: %v", err)
	}
	mustCLI(t, append([]string{"schedules", "delete", "acme/web", "1"}, flags...)...)
	if _, err := runCLI(t, append([]string{"schedules", "show", "acme/web", "1"}, flags...)...); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("show a deleted schedule: %v", err)
	}
}

func TestTriggersAgainstARealCoordinator(t *testing.T) {
	hs, admin := realCoordinator(t)
	flags := []string{"--server", hs.URL, "--admin-token", admin}
	if _, err := client.New(hs.URL, admin).CreateProject(t.Context(), restapi.CreateProjectRequest{Path: "acme/web"}); err != nil {
		t.Fatal(err)
	}
	tok := strings.TrimSpace(mustCLI(t, append([]string{"triggers", "create", "acme/web", "--description", "deploy", "--expires-at", "2099-01-01"}, flags...)...))
	if !strings.HasPrefix(tok, "glptt-") || strings.ContainsAny(tok, " \n") {
		t.Fatalf("triggers create printed %q, want only the token", tok)
	}
	out := mustCLI(t, append([]string{"triggers", "list", "acme/web", "--json"}, flags...)...)
	var list []restapi.PipelineTriggerJSON
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].Token == tok || !strings.HasPrefix(tok, list[0].Token) ||
		list[0].ExpiresAt == nil || !strings.HasPrefix(*list[0].ExpiresAt, "2099-01-01") {
		t.Fatalf("list: %q %v", out, err)
	}
	if _, err := runCLI(t, append([]string{"triggers", "create", "acme/web", "--description", "x", "--expires-at", "someday"}, flags...)...); err == nil || !strings.Contains(err.Error(), "not a date") {
		t.Errorf("a bad expiry: %v", err)
	}
	mustCLI(t, append([]string{"triggers", "delete", "acme/web", "1"}, flags...)...)
	if out := mustCLI(t, append([]string{"triggers", "list", "acme/web", "--json"}, flags...)...); strings.TrimSpace(out) != "[]" {
		t.Errorf("after delete: %q", out)
	}
}
