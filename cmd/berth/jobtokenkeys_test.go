package main

import (
	"strings"
	"testing"
)

// TestJobTokenKeysRotation: rotate, list and remove on a data directory's
// store, as an operator runs them beside a coordinator.
func TestJobTokenKeysRotation(t *testing.T) {
	dir := t.TempDir()
	first, err := runCLI(t, "server", "job-token-keys", "rotate", "--data", dir)
	if err != nil {
		t.Fatal(err)
	}
	second, err := runCLI(t, "server", "job-token-keys", "rotate", "--data", dir)
	if err != nil {
		t.Fatal(err)
	}
	first, second = strings.TrimSpace(first), strings.TrimSpace(second)
	list, err := runCLI(t, "server", "job-token-keys", "list", "--data", dir)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(list), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], first+"\t") || !strings.HasSuffix(lines[0], "verifies") ||
		!strings.HasPrefix(lines[1], second+"\t") || !strings.HasSuffix(lines[1], "signs") {
		t.Fatalf("list:\n%s", list)
	}
	if _, err := runCLI(t, "server", "job-token-keys", "remove", second, "--data", dir); err == nil || !strings.Contains(err.Error(), "rotate before removing") {
		t.Fatalf("removing the signing key: %v", err)
	}
	if _, err := runCLI(t, "server", "job-token-keys", "remove", first, "--data", dir); err != nil {
		t.Fatal(err)
	}
	if list, _ = runCLI(t, "server", "job-token-keys", "list", "--data", dir); strings.Count(list, "\n") != 1 || !strings.Contains(list, second) {
		t.Fatalf("after removal:\n%s", list)
	}
}

// TestKeyIDAfterDashes: a key id that begins with '-' (an OIDC thumbprint
// may, and a job token key id made before they were drawn again) is
// passed after --, and a remove that took it for a flag says so.
func TestKeyIDAfterDashes(t *testing.T) {
	dir := t.TempDir()
	for _, keys := range []string{"job-token-keys", "oidc-keys"} {
		_, err := runCLI(t, "server", keys, "remove", "-Xq3", "--data", dir)
		if err == nil || !strings.Contains(err.Error(), "goes after --: berth server "+keys+" remove [flags] -- KID") {
			t.Errorf("%s remove -Xq3: %v", keys, err)
		}
		// After -- it is the key id: no such key, rather than a flag.
		_, err = runCLI(t, "server", keys, "remove", "--data", dir, "--", "-Xq3")
		if err == nil || !strings.Contains(err.Error(), "-Xq3") || strings.Contains(err.Error(), "flag") {
			t.Errorf("%s remove -- -Xq3: %v", keys, err)
		}
	}
}
