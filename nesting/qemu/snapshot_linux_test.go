package qemu

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/berthci/berth/guest"
	"github.com/berthci/berth/nesting"
)

// TestSnapshotRestore: a running VM — restored from its template, or
// booted cold — is saved whole while a process runs in it; the bundle
// restores, after the VM is gone, into a VM where that process still
// runs, the files are there and the host name is the VM's.
func TestSnapshotRestore(t *testing.T) {
	imageDir := needBoot(t)
	for _, warm := range []bool{true, false} {
		name := map[bool]string{true: "warm", false: "cold"}[warm]
		t.Run(name, func(t *testing.T) {
			state := stateDir(t)
			h := initHV(t, bootConfig(state, imageDir, `"warm_start": `+map[bool]string{true: "true", false: "false"}[warm]))
			ctx := context.Background()
			v, err := h.Create(ctx, testImage)
			if err != nil {
				t.Fatal(err)
			}
			c := agent(t, v)
			leaveFileAndProcess(t, c)
			var bundle bytes.Buffer
			job := BundleJob{ID: 42, Point: "on_failure", Dir: "/builds/p", Shell: "sh", Env: []string{"A=1"}}
			if err := h.SnapshotVM(ctx, v.ID, job, &bundle); err != nil {
				t.Fatal(err)
			}
			// The VM runs on after its snapshot.
			if out, err := run(t, c, "cat /builds/p/file"); err != nil || strings.TrimSpace(out) != "written-before" {
				t.Fatalf("the VM after its snapshot: %q, %v", out, err)
			}
			if err := h.Delete(ctx, v.ID); err != nil {
				t.Fatal(err)
			}
			t.Logf("bundle: %d bytes", bundle.Len())
			dir, err := os.MkdirTemp("", "bd")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(dir)
			meta, err := ReadBundle(&bundle, dir)
			if err != nil {
				t.Fatal(err)
			}
			if meta.VM != v.ID || meta.Job.ID != 42 || meta.Job.Dir != "/builds/p" || meta.MemBackend != warm || meta.Image != testImage {
				t.Errorf("meta %+v", meta)
			}
			r, err := RestoreBundle(ctx, dir, meta, RestoreOptions{Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if r.Info.Hostname != v.ID {
				t.Errorf("restored host name %q, want %q", r.Info.Hostname, v.ID)
			}
			out, err := run(t, r.Agent, "cat /builds/p/file; "+findSleeper)
			if err != nil || !strings.Contains(out, "written-before") || !strings.Contains(out, "still-running") {
				t.Errorf("in the restored VM: %q, %v", out, err)
			}
		})
	}
}

// findSleeper prints still-running when the process leaveFileAndProcess
// started runs.
const findSleeper = `for f in /proc/[0-9]*/cmdline; do case "$(tr '\0' ' ' < $f)" in "sleep 31337"*) echo still-running;; esac; done`

// leaveFileAndProcess writes /builds/p/file (written-before) in the VM
// of c and leaves a process running there.
func leaveFileAndProcess(t *testing.T, c *guest.Client) {
	t.Helper()
	if out, err := run(t, c, `mkdir -p /builds/p && echo written-before > /builds/p/file && (setsid sleep 31337 </dev/null >/dev/null 2>&1 &) && sync
for i in $(seq 50); do for f in /proc/[0-9]*/cmdline; do case "$(tr '\0' ' ' < $f)" in "sleep 31337"*) exit 0;; esac; done; sleep 0.1; done; exit 1`); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, _ := run(t, c, findSleeper); !strings.Contains(out, "still-running") {
		t.Fatal("the process the first command left is not running in the VM")
	}
}

// TestCreateFromBundle: a VM's bundle becomes a VM of another daemon
// (its own state directory) with the VM's files and processes, its own
// id as host name, listed and deleted like any VM; a bundle that cannot
// run there (KVM's on a TCG daemon, another machine type) is refused and
// leaves nothing behind.
func TestCreateFromBundle(t *testing.T) {
	imageDir := needBoot(t)
	ctx := context.Background()
	h := initHV(t, bootConfig(stateDir(t), imageDir))
	v, err := h.Create(ctx, testImage)
	if err != nil {
		t.Fatal(err)
	}
	leaveFileAndProcess(t, agent(t, v))
	var bundle bytes.Buffer
	job := BundleJob{ID: 7, Point: "on_failure", Dir: "/builds/p", Shell: "sh", TmpDir: "/builds/p.tmp", CacheDir: "/cache"}
	if err := h.SnapshotVM(ctx, v.ID, job, &bundle); err != nil {
		t.Fatal(err)
	}

	state := stateDir(t)
	other := initHV(t, bootConfig(state, imageDir))
	r, gotJob, err := other.CreateFromBundle(ctx, &bundle)
	if err != nil {
		t.Fatal(err)
	}
	if r.ID == v.ID || !nesting.ValidID(r.ID) || r.Name != testImage {
		t.Errorf("VM from the bundle: %+v, want a new id and image %s", r, testImage)
	}
	if gotJob.ID != 7 || gotJob.Dir != "/builds/p" || gotJob.TmpDir != "/builds/p.tmp" || gotJob.CacheDir != "/cache" {
		t.Errorf("the bundle's job: %+v, want %+v", gotJob, job)
	}
	rc := agent(t, r)
	out, err := run(t, rc, "cat /builds/p/file; hostname; "+findSleeper)
	if err != nil || !strings.Contains(out, "written-before") || !strings.Contains(out, "still-running") {
		t.Errorf("in the VM from the bundle: %q, %v", out, err)
	}
	if !strings.Contains(out, r.ID+"\n") {
		t.Errorf("host name in %q, want the new VM's id %s", out, r.ID)
	}
	if vms, err := other.List(ctx); err != nil || len(vms) != 1 || vms[0] != r {
		t.Errorf("List: %v, %v, want [%v]", vms, err, r)
	}
	dir := vmDir(state, r.ID)
	if err := other.Delete(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the VM's directory after Delete: %v", err)
	}

	kvm := goodMeta()
	kvm.Accel = AccelKVM
	q35 := goodMeta()
	q35.Machine = MachineQ35
	for name, tc := range map[string]struct {
		meta BundleMeta
		want string
	}{
		"kvm": {kvm, "needs KVM"},
		"q35": {q35, "of a q35 machine; this daemon runs microvm machines"},
	} {
		// Refused on its metadata, before the rest is read.
		_, _, err := other.CreateFromBundle(ctx, bytes.NewReader(bundleOf(t, tc.meta)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("a bundle %s: %v, want an error saying %q", name, err, tc.want)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "vms")); len(ents) != 0 {
		t.Errorf("after the refused bundles, %s/vms holds %v", state, ents)
	}
}

// bundleOf makes a bundle stream of members (name, content) with meta.
func bundleOf(t testing.TB, meta any, members ...string) []byte {
	var b bytes.Buffer
	zw, _ := zstd.NewWriter(&b)
	tw := tar.NewWriter(zw)
	mb, _ := json.Marshal(meta)
	tw.WriteHeader(&tar.Header{Name: bundleMeta, Mode: 0o600, Size: int64(len(mb)), Typeflag: tar.TypeReg})
	tw.Write(mb)
	for _, m := range members {
		tw.WriteHeader(&tar.Header{Name: m, Mode: 0o600, Size: 1, Typeflag: tar.TypeReg})
		tw.Write([]byte("x"))
	}
	tw.Close()
	zw.Close()
	return b.Bytes()
}

func goodMeta() BundleMeta {
	return BundleMeta{Format: BundleFormat, VM: "nesting-abcd1234", BootID: "nesting-efgh5678", Machine: MachineMicroVM, Accel: AccelTCG,
		CPUs: 1, MemoryMB: 256, Network: NetworkUser}
}

func TestReadBundleRejects(t *testing.T) {
	all := []string{bundleKernel, bundleInitramfs, bundleDisk, bundleState}
	if _, err := ReadBundle(bytes.NewReader(bundleOf(t, goodMeta(), all...)), t.TempDir()); err != nil {
		t.Fatalf("a good bundle: %v", err)
	}
	bad := goodMeta()
	bad.Format = "other"
	badID := goodMeta()
	badID.VM = "nesting-x,if=none"
	badMem := goodMeta()
	badMem.MemoryMB = 1
	for name, b := range map[string][]byte{
		"not zstd":      []byte("plain"),
		"format":        bundleOf(t, bad, all...),
		"id":            bundleOf(t, badID, all...),
		"memory":        bundleOf(t, badMem, all...),
		"missing state": bundleOf(t, goodMeta(), bundleKernel, bundleInitramfs, bundleDisk),
		"a path":        bundleOf(t, goodMeta(), bundleKernel, "../initramfs", bundleDisk, bundleState),
		"extra":         bundleOf(t, goodMeta(), append(all, "more")...),
		"order":         bundleOf(t, goodMeta(), bundleInitramfs, bundleKernel, bundleDisk, bundleState),
	} {
		if _, err := ReadBundle(bytes.NewReader(b), t.TempDir()); err == nil || !strings.Contains(err.Error(), "snapshot bundle") {
			t.Errorf("%s: %v, want a snapshot bundle error", name, err)
		}
	}
}

func FuzzReadBundle(f *testing.F) {
	f.Add(bundleOf(f, goodMeta(), bundleKernel, bundleInitramfs, bundleDisk, bundleState))
	f.Add([]byte("x"))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if _, err := ReadBundle(bytes.NewReader(b), dir); err != nil {
			return
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.ContainsAny(e.Name(), "/") || filepath.Base(e.Name()) != e.Name() {
				t.Fatalf("wrote %q", e.Name())
			}
		}
	})
}
