package testenv

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// VMs skips (fails with BERTH_REQUIRE_DEPS=1) a test that boots microVMs
// unless this machine can: root (VM images keep files' owners), QEMU,
// qemu-img, mkfs.ext4 and a kernel in /boot. Tests skip under -short.
func VMs(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots VMs")
	}
	Root(t)
	for _, p := range []string{"qemu-system-x86_64", "qemu-img", "mkfs.ext4"} {
		LookPath(t, p)
	}
	if ks, _ := filepath.Glob("/boot/vmlinuz-*"); len(ks) == 0 {
		Missing(t, "no kernel in /boot (apt-get install linux-image-amd64)")
	}
}

// SyncBuffer is a bytes.Buffer safe for concurrent use (a job's output
// written by one goroutine, read by the test's).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// DockerImage skips (fails with BERTH_REQUIRE_DEPS=1) unless the local
// Docker engine has image ref (the test images are built by .ci/images).
func DockerImage(t testing.TB, ref string) {
	t.Helper()
	docker := LookPath(t, "docker")
	if out, err := exec.Command(docker, "image", "inspect", "--format", "{{.Id}}", ref).CombinedOutput(); err != nil {
		Missing(t, "docker engine with image %s (built by .ci/images): %v %s", ref, err, bytes.TrimSpace(out))
	}
}
