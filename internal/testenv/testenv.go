// Package testenv decides what a test does when something it needs from the
// machine is missing: locally it skips with a clear reason, in CI (or whenever
// BERTH_REQUIRE_DEPS=1) it fails, so a green CI run means every
// dependency-needing test really ran.
package testenv

import (
	"net"
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

// DockerBridge returns this host's IPv4 address on Docker's default
// bridge (docker0), where containers reach servers on the host, or
// skips/fails the test when there is none.
func DockerBridge(t testing.TB) string {
	t.Helper()
	ifc, err := net.InterfaceByName("docker0")
	if err != nil {
		Missing(t, "no docker0 bridge: %v", err)
		return ""
	}
	addrs, _ := ifc.Addrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	Missing(t, "docker0 has no IPv4 address")
	return ""
}
