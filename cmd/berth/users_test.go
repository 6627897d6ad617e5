package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/client"
	"github.com/berthci/berth/coordinator/restapi"
)

func TestUsersAgainstARealCoordinator(t *testing.T) {
	hs, admin := realCoordinator(t)
	flags := []string{"--server", hs.URL, "--admin-token", admin}

	out, err := runCLI(t, append([]string{"users", "create", "bob"}, flags...)...)
	if err != nil {
		t.Fatal(err)
	}
	if tok := strings.TrimSpace(out); strings.Count(out, "\n") != 1 || !strings.HasPrefix(tok, "glpat-") {
		t.Fatalf("users create printed %q, want only a token", out)
	}
	if _, err := runCLI(t, append([]string{"users", "create", "bob"}, flags...)...); err == nil || !strings.Contains(err.Error(), "409") {
		t.Errorf("a second bob: %v", err)
	}
	if _, err := runCLI(t, append([]string{"users", "create", "eve", "--role", "root"}, flags...)...); err == nil {
		t.Error("an unknown role was accepted")
	}
	if _, err := runCLI(t, append([]string{"users", "create", "ann", "--role", "admin"}, flags...)...); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(t, append([]string{"users", "list", "--json"}, flags...)...)
	if err != nil {
		t.Fatal(err)
	}
	var list []restapi.UserJSON
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "bob" || list[0].Role != "read-only" || list[1].Role != "admin" || list[0].Token != "" {
		t.Fatalf("list %+v", list)
	}
	if _, err := runCLI(t, append([]string{"users", "delete", "1"}, flags...)...); err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI(t, append([]string{"users", "delete", "1"}, flags...)...); err == nil {
		t.Error("deleting a deleted user succeeded")
	}
}

func TestMembersAgainstARealCoordinator(t *testing.T) {
	hs, admin := realCoordinator(t)
	flags := []string{"--server", hs.URL, "--admin-token", admin}
	if _, err := client.New(hs.URL, admin).CreateProject(t.Context(), restapi.CreateProjectRequest{Path: "acme/web"}); err != nil {
		t.Fatal(err)
	}
	bob := strings.TrimSpace(mustCLI(t, append([]string{"users", "create", "bob"}, flags...)...))

	out, err := runCLI(t, append([]string{"members", "add", "acme/web", "bob", "--access", "maintainer"}, flags...)...)
	if err != nil || out != "bob is maintainer of acme/web\n" {
		t.Fatalf("members add: %q %v", out, err)
	}
	// Adding again changes the level.
	if out, err := runCLI(t, append([]string{"members", "add", "acme/web", "bob", "--access", "20"}, flags...)...); err != nil || out != "bob is reporter of acme/web\n" {
		t.Fatalf("members add again: %q %v", out, err)
	}
	if _, err := runCLI(t, append([]string{"members", "add", "acme/web", "bob", "--access", "boss"}, flags...)...); err == nil || !strings.Contains(err.Error(), "want guest, reporter") {
		t.Errorf("an unknown level: %v", err)
	}
	out, err = runCLI(t, append([]string{"members", "list", "acme/web", "--json"}, flags...)...)
	var list []restapi.MemberJSON
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].Username != "bob" || list[0].AccessLevel != 20 {
		t.Fatalf("members list: %q %v", out, err)
	}
	// A maintainer manages members with their own token; a member leaves
	// by their own name.
	if _, err := runCLI(t, append([]string{"members", "add", "acme/web", "bob", "--access", "maintainer"}, flags...)...); err != nil {
		t.Fatal(err)
	}
	carol := strings.TrimSpace(mustCLI(t, "users", "create", "carol", "--server", hs.URL, "--admin-token", admin))
	asBob := []string{"--server", hs.URL, "--token", bob}
	if out, err := runCLI(t, append([]string{"members", "add", "acme/web", "carol"}, asBob...)...); err != nil || out != "carol is developer of acme/web\n" {
		t.Fatalf("members add as a maintainer: %q %v", out, err)
	}
	if _, err := runCLI(t, append([]string{"members", "add", "acme/web", "carol", "--access", "owner"}, asBob...)...); err == nil || !strings.Contains(err.Error(), "at most the maintainer level") {
		t.Errorf("a maintainer making an owner: %v", err)
	}
	if _, err := runCLI(t, "members", "remove", "acme/web", "carol", "--server", hs.URL, "--token", carol); err != nil {
		t.Fatalf("carol leaves: %v", err)
	}
	if _, err := runCLI(t, append([]string{"members", "remove", "acme/web", "bob"}, flags...)...); err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI(t, append([]string{"members", "remove", "acme/web", "bob"}, flags...)...); err == nil || !strings.Contains(err.Error(), "not a member") {
		t.Errorf("removing a non-member: %v", err)
	}
}

func mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runCLI(t, args...)
	if err != nil {
		t.Fatalf("berth %s: %v", strings.Join(args, " "), err)
	}
	return out
}
