// Package testenv decides what a test does when something it needs from the
// machine is missing: locally it skips with a clear reason, in CI (or whenever
// BERTH_REQUIRE_DEPS=1) it fails, so a green CI run means every
// dependency-needing test really ran.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// RequireEnv is the environment variable that turns missing dependencies
// from skips into failures. .ci/run sets it.
const RequireEnv = "BERTH_REQUIRE_DEPS"

// Required reports whether missing dependencies must fail tests.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Missing skips the test (or fails it when dependencies are required) with
// the given reason.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if Required() {
		t.Fatalf("required dependency missing ("+RequireEnv+"=1): "+format, args...)
	}
	t.Skipf("skipping: "+format, args...)
}

// LookPath returns the path of a program the test needs, or skips/fails the
// test when it is not installed.
func LookPath(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "%s not found in PATH", name)
	}
	return p
}

// Root skips/fails the test unless it runs as root.
func Root(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "test needs root")
	}
}
