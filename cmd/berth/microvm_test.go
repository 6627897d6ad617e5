package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthci/berth/internal/testenv"
)

const vmTestImage = "berth-test/debian:bookworm" // built by .ci/images: bash, git

// needMicroVMs skips (fails with BERTH_REQUIRE_DEPS=1) unless microVMs
// run here, and returns the environment of berth commands that share one
// VM image cache.
func needMicroVMs(t *testing.T) []string {
	t.Helper()
	testenv.VMs(t)
	for _, p := range []string{"git", "docker", "go"} {
		testenv.LookPath(t, p)
	}
	testenv.DockerImage(t, vmTestImage)
	return append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
}

// berthCmd runs the berth binary with env.
func berthCmd(t *testing.T, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(testenv.Berth(t), args...)
	cmd.Env = env
	return cmd
}

// leftVMs lists the QEMU processes and state directories of berth run's
// microVMs.
func leftVMs() string {
	var b strings.Builder
	for _, p := range testenv.Processes("berth-run-vm-") {
		fmt.Fprintln(&b, p)
	}
	if ds, _ := filepath.Glob(filepath.Join(os.TempDir(), "berth-run-vm-*")); len(ds) > 0 {
		fmt.Fprintf(&b, "state directories: %v\n", ds)
	}
	return b.String()
}

// TestMicroVMJobsEndToEnd: a pipeline with jobs at isolation levels none,
// container and microvm, run by berth run (its embedded coordinator and
// one runner manager). The microvm job's image is a local Docker image
// converted by `berth image build` first; in the VM the job sees the
// guest's own kernel (another boot, booted for it) and none of the host's
// processes, clones the project from the coordinator and hands an
// artifact to a job on the host. Then a microvm job is canceled mid-
// script (SIGINT to berth run): its VM is destroyed. Nothing is left.
func TestMicroVMJobsEndToEnd(t *testing.T) {
	env := needMicroVMs(t)
	if l := leftVMs(); l != "" {
		t.Fatalf("microVMs of berth run before the test:\n%s", l)
	}
	start := time.Now()
	out, err := berthCmd(t, env, "image", "build", vmTestImage).CombinedOutput()
	if err != nil {
		t.Fatalf("berth image build: %v\n%s", err, out)
	}
	t.Logf("berth image build %s (%v):\n%s", vmTestImage, time.Since(start).Round(time.Millisecond), out)

	// A process on the host the VM must not see.
	marker := fmt.Sprintf("host-marker-%d", time.Now().UnixNano())
	sleeper := exec.Command("sh", "-c", "exec -a "+marker+" sleep 600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
	hostBoot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "source.txt"), []byte("from the repository\n"), 0o644)
	os.WriteFile(filepath.Join(dir, ".gitlab-ci.yml"), []byte(`
stages: [build, check]
vm:
  stage: build
  isolation: microvm
  image: `+vmTestImage+`
  script:
    - echo "boot $(cat /proc/sys/kernel/random/boot_id) kernel $(uname -r)"
    - echo "kernel cmdline $(cat /proc/cmdline)"
    - echo "pid1 $(tr '\0' ' ' < /proc/1/cmdline)"
    - for f in /proc/[0-9]*/cmdline; do case "$(tr '\0' ' ' < $f 2>/dev/null)" in *"$MARKER"*) echo "SEES THE ""HOST $f";; esac; done
    - cat source.txt
    - mkdir -p out && uname -r > out/kernel.txt
  artifacts:
    paths: [out/]
container:
  stage: build
  isolation: container
  image: `+vmTestImage+`
  script:
    - test -f /.dockerenv && echo in-a-container
host:
  stage: check
  needs: [vm]
  script:
    - echo "host job reads $(cat out/kernel.txt)"
    - test "$(cat /proc/sys/kernel/random/boot_id)" = "$HOST_BOOT"
`), 0o644)
	start = time.Now()
	cmd := berthCmd(t, env, "run", dir, "--var", "MARKER="+marker, "--var", "HOST_BOOT="+strings.TrimSpace(string(hostBoot)))
	out, err = cmd.CombinedOutput()
	t.Logf("berth run (%v):\n%s", time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("berth run: %v", err)
	}
	s := string(out)
	for _, want := range []string{"Running in microVM nesting-", "berth.hostname=nesting-", "berth guest --init", "from the repository", "in-a-container", "host job reads "} {
		if !strings.Contains(s, want) {
			t.Errorf("the run's output lacks %q", want)
		}
	}
	if strings.Contains(s, "SEES THE HOST") {
		t.Error("the microVM job sees a host process")
	}
	if strings.Contains(s, "boot "+strings.TrimSpace(string(hostBoot))) {
		t.Error("the microVM job runs on the host's kernel (same boot id)")
	}
	if l := leftVMs(); l != "" {
		t.Errorf("left after the run:\n%s", l)
	}

	// Cancel: SIGINT while the VM job sleeps.
	cdir := t.TempDir()
	os.WriteFile(filepath.Join(cdir, ".gitlab-ci.yml"), []byte(`
sleeps:
  isolation: microvm
  image: `+vmTestImage+`
  variables: {GIT_STRATEGY: none}
  script:
    - echo "started in $(hostname)"
    - sleep 600
`), 0o644)
	cmd = berthCmd(t, env, "run", cdir)
	var buf testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for !strings.Contains(buf.String(), "started in nesting-") {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the job never started:\n%s", buf.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	running := leftVMs()
	if !strings.Contains(running, "qemu-system") {
		t.Errorf("no QEMU of berth run while its job runs:\n%s", running)
	}
	cmd.Process.Signal(syscall.SIGINT)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err = <-waited:
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("berth run did not end after SIGINT:\n%s", buf.String())
	}
	t.Logf("canceled run: %v\n%s", err, buf.String())
	if !strings.Contains(buf.String(), "canceled") {
		t.Errorf("the canceled run does not say so")
	}
	if l := leftVMs(); l != "" {
		t.Errorf("left after the canceled run:\n%s", l)
	}
}
