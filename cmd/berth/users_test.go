package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/restapi"
)

func TestUsersAgainstARealCoordinator(t *testing.T) {
	srv, err := embedded.Open(context.Background(), embedded.Options{DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	admin, err := srv.EnsureAdminToken(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
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
