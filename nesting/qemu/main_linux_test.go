package qemu

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/vmimage"
)

// sleeperEnv makes the test binary a process that only waits to be
// killed, with whatever arguments it was given: a stand-in for a leftover
// QEMU whose command line names a VM directory. With the value "stubborn"
// it ignores SIGTERM.
const sleeperEnv = "BERTH_QEMU_TEST_SLEEPER"

// shared holds the vmimage store the tests that boot VMs share (the
// initramfs and the busybox root filesystem are built once).
var shared struct {
	once     sync.Once
	imageDir string
	agent    string // the berth binary the guests run
	err      error
}

func TestMain(m *testing.M) {
	if mode := os.Getenv(sleeperEnv); mode != "" {
		if mode == "stubborn" {
			signal.Ignore(syscall.SIGTERM)
		}
		fmt.Println("ready")
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	code := m.Run()
	if shared.imageDir != "" {
		os.RemoveAll(shared.imageDir)
	}
	testenv.RemoveBuilt()
	os.Exit(code)
}

// testImage is the image the boot tests run (built by .ci/images).
const testImage = "berth-test/busybox:latest"

// needBoot skips (fails with BERTH_REQUIRE_DEPS=1) a test that boots VMs
// unless everything is there: root, QEMU, qemu-img, a kernel with its
// modules, a static busybox, mkfs.ext4, Go (to build berth), the Docker
// engine with testImage. It returns the berth binary and the shared image
// directory.
func needBoot(t *testing.T) (imageDir string) {
	t.Helper()
	testenv.VMs(t)
	testenv.LookPath(t, "go")
	if out, err := exec.Command("/bin/busybox", "--list").Output(); err != nil || !strings.Contains(string(out), "sh\n") {
		testenv.Missing(t, "no /bin/busybox (apt-get install busybox-static): %v", err)
	}
	testenv.DockerImage(t, testImage)
	shared.once.Do(func() {
		shared.imageDir, shared.err = os.MkdirTemp("", "qemu-test-images-")
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	shared.agent = testenv.Berth(t)
	return shared.imageDir
}

// testLogger logs to the test.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// stateDir is a short state directory (agent socket paths must stay under
// 108 bytes), removed after the test.
func stateDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "bq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// newTestHypervisor is a hypervisor logging to the test.
func newTestHypervisor(t testing.TB) *Hypervisor { return New(testLogger(t)) }

// bootConfig is the JSON config of the boot tests: TCG, small VMs, the
// shared image directory.
func bootConfig(state, imageDir string, extra ...string) []byte {
	kv := append([]string{`"accel": "tcg"`, `"memory_mb": 256`, fmt.Sprintf("%q: %q", "state_dir", state),
		fmt.Sprintf("%q: %q", "image_dir", imageDir), fmt.Sprintf("%q: %q", "agent", shared.agent)}, extra...)
	return []byte("{" + strings.Join(kv, ", ") + "}")
}

// storeFor returns the vmimage store of imageDir (to look at its files).
func storeFor(imageDir string) *vmimage.Store { return &vmimage.Store{Dir: imageDir} }
