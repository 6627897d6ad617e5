package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// BinaryEnv names a prebuilt berth binary for the tests that need one
// (.ci/run builds it once for all packages).
const BinaryEnv = "BERTH_TEST_BINARY"

var built struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// Berth returns a berth binary built from this tree: $BERTH_TEST_BINARY
// when set, else one built once per test process (go build, so Go must
// be installed). Test binaries that call it remove the build at the end
// with RemoveBuilt in TestMain.
func Berth(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		if p := os.Getenv(BinaryEnv); p != "" {
			if _, err := os.Stat(p); err != nil {
				built.err = fmt.Errorf("%s: %w", BinaryEnv, err)
			}
			built.path = p
			return
		}
		goTool, err := exec.LookPath("go")
		if err != nil {
			built.err = fmt.Errorf("building berth: %w", err)
			return
		}
		if built.dir, built.err = os.MkdirTemp("", "berth-test-bin-"); built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "berth")
		start := time.Now()
		out, err := exec.Command(goTool, "build", "-o", built.path, "github.com/berthci/berth/cmd/berth").CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("building berth: %v\n%s", err, out)
			return
		}
		fmt.Fprintf(os.Stderr, "testenv: built berth in %v\n", time.Since(start).Round(time.Millisecond))
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

// RemoveBuilt removes the binary Berth built, if it did.
func RemoveBuilt() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}
