package vmimage

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/berthci/berth/internal/testenv"
)

const (
	busyboxImage = "berth-test/busybox:latest"
	debianImage  = "berth-test/debian:bookworm"
)

// needDocker skips (fails in CI) unless the Docker engine runs and has
// the image.
func needDocker(t *testing.T, image string) {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		testenv.Missing(t, "docker client: %v", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		testenv.Missing(t, "docker engine: %v", err)
	}
	if _, err := cli.ImageInspect(ctx, image); err != nil {
		testenv.Missing(t, "image %s (built by .ci/images): %v", image, err)
	}
}

// needBuild skips (fails in CI) unless Build can run: root, mkfs.ext4,
// debugfs.
func needBuild(t *testing.T) {
	t.Helper()
	testenv.Root(t)
	testenv.LookPath(t, "mkfs.ext4")
	testenv.LookPath(t, "debugfs")
	testenv.LookPath(t, "dumpe2fs")
}

func TestBuildDockerBusybox(t *testing.T) {
	needBuild(t)
	needDocker(t, busyboxImage)
	log, lines := countingLogger(t)
	s := &Store{Dir: t.TempDir(), Logger: log}
	ctx := context.Background()
	start := time.Now()
	img, err := s.Build(ctx, busyboxImage, BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("built %s (%s) in %v: %s, %d bytes", img.Name, img.Digest, took.Round(time.Millisecond), img.Path, img.Size)
	if img.Name != busyboxImage || !strings.HasPrefix(img.Digest, "sha256:") || img.Format != FormatExt4 || img.Size == 0 {
		t.Fatalf("%+v", img)
	}
	fi, err := os.Stat(img.Path)
	if err != nil || fi.Mode().Perm() != 0o444 || fi.Size() != img.Size {
		t.Fatalf("root filesystem file: %v %v", fi, err)
	}
	checkGuestDirs(t, img.Path)
	// The image's own files, modes and links.
	if in, ok := debugfsStat(t, img.Path, "/bin/busybox"); !ok || in.typ != "regular" || in.mode != 0o755 {
		t.Errorf("/bin/busybox: %v", in)
	}
	if in, ok := debugfsStat(t, img.Path, "/bin/sh"); !ok || in.typ != "symlink" || in.fastTarget != "busybox" {
		t.Errorf("/bin/sh: %v %q", in, in.fastTarget)
	}
	if got := debugfsCat(t, img.Path, "/etc/passwd"); !strings.Contains(got, "nobody:x:65534") {
		t.Errorf("/etc/passwd: %q", got)
	}
	if _, ok := debugfsStat(t, img.Path, "/.dockerenv"); ok {
		t.Error("/.dockerenv is in the VM image")
	}
	if free, err := ext4Free(ctx, img.Path); err != nil || free < MinFree {
		t.Errorf("free space %d (%v), want at least %d", free, err, MinFree)
	}
	m, err := readMeta(filepath.Join(filepath.Dir(img.Path), "meta.json"))
	if err != nil || m.Digest != img.Digest || m.Format != FormatExt4 || m.Size != img.Size || m.Built.IsZero() || m.Used.IsZero() ||
		!slices.Contains(m.Names, "docker.io/berth-test/busybox:latest") {
		t.Errorf("meta.json: %+v %v", m, err)
	}

	// The cache: a second Build, also by another spelling of the name,
	// is the same file, not rebuilt.
	start = time.Now()
	again, err := s.Build(ctx, "berth-test/busybox", BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cached Build: %v", time.Since(start).Round(time.Microsecond))
	fi2, _ := os.Stat(again.Path)
	if again.Path != img.Path || !os.SameFile(fi, fi2) || again.Name != "berth-test/busybox" || !again.Used.After(img.Used) {
		t.Errorf("second Build %+v, want the cached %+v", again, img)
	}
	if n := lines.count("extracting the image's filesystem"); n != 1 {
		t.Errorf("%d builds, want 1", n)
	}
	for _, ref := range []string{busyboxImage, "docker.io/berth-test/busybox:latest", img.Digest} {
		got, err := s.Lookup(ref)
		if err != nil || got.Path != img.Path {
			t.Errorf("Lookup(%s): %+v %v", ref, got, err)
		}
	}
	if _, err := s.Lookup("berth-test/busybox:other"); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("Lookup of another tag: %v", err)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].Path != img.Path || list[0].Name != busyboxImage {
		t.Errorf("List: %+v %v", list, err)
	}

	// erofs, from the same digest, is a build of its own.
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		testenv.Missing(t, "mkfs.erofs (erofs-utils): %v", err)
	}
	ro, err := s.Build(ctx, busyboxImage, BuildOptions{Format: FormatEROFS})
	if err != nil {
		t.Fatal(err)
	}
	if ro.Path == img.Path || ro.Format != FormatEROFS || ro.Digest != img.Digest {
		t.Fatalf("erofs build %+v", ro)
	}
	if fsck, err := exec.LookPath("fsck.erofs"); err == nil {
		out, err := exec.Command(fsck, ro.Path).CombinedOutput()
		if err != nil {
			t.Errorf("fsck.erofs: %v\n%s", err, out)
		}
	}
	t.Logf("erofs: %d bytes", ro.Size)
}

// checkGuestDirs checks what Build adds for the guest agent.
func checkGuestDirs(t *testing.T, fs string) {
	t.Helper()
	// Mount points the image has keep their modes.
	for p, want := range map[string]int64{"/builds": 0o755, "/cache": 0o755, "/tmp": 0o1777, "/proc": -1, "/sys": -1, "/dev": -1, "/usr/local/berth": 0o755} {
		in, ok := debugfsStat(t, fs, p)
		if !ok || in.typ != "directory" || (want >= 0 && in.mode != want) || in.uid != 0 {
			t.Errorf("%s: %v (exists %v), want a directory %o of root", p, in, ok, want)
		}
	}
	if got := debugfsLs(t, fs, "/usr/local/berth"); len(got) != 0 {
		t.Errorf("/usr/local/berth holds %v", got)
	}
	if got := debugfsCat(t, fs, "/etc/resolv.conf"); got != GuestResolvConf {
		t.Errorf("/etc/resolv.conf: %q", got)
	}
	if got := debugfsCat(t, fs, "/etc/hosts"); !strings.Contains(got, "localhost") {
		t.Errorf("/etc/hosts: %q", got)
	}
}

func TestBuildDockerDebian(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 230 MB image")
	}
	needBuild(t)
	needDocker(t, debianImage)
	s := &Store{Dir: t.TempDir(), Logger: testLogger(t)}
	start := time.Now()
	img, err := s.Build(context.Background(), debianImage, BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s in %v: %d bytes", debianImage, time.Since(start).Round(time.Millisecond), img.Size)
	checkGuestDirs(t, img.Path)
	for p, want := range map[string]string{
		"/usr/bin/passwd": "regular 4755 0:0",  // setuid
		"/usr/bin/chage":  "regular 2755 0:42", // setgid shadow
		"/etc/shadow":     "regular 640 0:42",
		"/var/mail":       "directory 2775 0:8", // setgid mail
		"/bin":            "symlink 777 0:0",    // usr-merged
		"/usr/bin/git":    "regular 755 0:0",
	} {
		in, ok := debugfsStat(t, img.Path, p)
		if got := in.String(); !ok || !strings.HasPrefix(got, want) {
			t.Errorf("%s: %s, want %s", p, got, want)
		}
	}
	if got := debugfsCat(t, img.Path, "/usr/lib/os-release"); !strings.Contains(got, "bookworm") {
		t.Errorf("/usr/lib/os-release: %q", got)
	}
	if in, _ := debugfsStat(t, img.Path, "/etc/os-release"); in.typ != "symlink" || in.fastTarget != "../usr/lib/os-release" {
		t.Errorf("/etc/os-release: %v %q", in, in.fastTarget)
	}
	// Hard links stay hard links: perl-base's two names of one file.
	a, _ := debugfsStat(t, img.Path, "/usr/bin/perl")
	b, _ := debugfsStat(t, img.Path, "/usr/bin/perl5.36.0")
	if a.ino == 0 || a.ino != b.ino || a.links < 2 {
		t.Errorf("perl %v (inode %d) and perl5.36.0 %v (inode %d) are not one file", a, a.ino, b, b.ino)
	}
}

// TestBuildConcurrent builds one image from many goroutines of two
// Stores on one Dir: one build, one file.
func TestBuildConcurrent(t *testing.T) {
	needBuild(t)
	needDocker(t, busyboxImage)
	dir := t.TempDir()
	log, lines := countingLogger(t)
	stores := []*Store{{Dir: dir, Logger: log}, {Dir: dir, Logger: log}}
	var wg sync.WaitGroup
	paths := make([]string, 6)
	errs := make([]error, 6)
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, err := stores[i%2].Build(context.Background(), busyboxImage, BuildOptions{})
			errs[i] = err
			if err == nil {
				paths[i] = img.Path
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("build %d: %v", i, err)
		}
		if paths[i] != paths[0] {
			t.Errorf("build %d: %s, want %s", i, paths[i], paths[0])
		}
	}
	if n := lines.count("extracting the image's filesystem"); n != 1 {
		t.Errorf("%d builds of one image, want 1", n)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(left) != 0 {
		t.Errorf("leftovers in tmp: %v", left)
	}
}

// TestBuildOCILayout builds from an OCI layout of two layers: modes,
// owners, links, a device node, and the second layer's whiteouts.
func TestBuildOCILayout(t *testing.T) {
	needBuild(t)
	base := []entry{
		dir("bin", 0o755), file("bin/tool", "#!/bin/sh\necho tool\n", 0o755),
		file("bin/su", "setuid", 0o4755), dir("shared", 0o2775), dir("sticky", 0o1777),
		{name: "home/user/", typ: tar.TypeDir, mode: 0o750, uid: 1000, gid: 1000},
		{name: "home/user/.profile", body: "PS1=x", typ: tar.TypeReg, mode: 0o600, uid: 1000, gid: 1000},
		symlink("bin/link", "tool"), hardlink("bin/hard", "bin/tool"),
		{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
		file("gone", "x", 0o644), dir("opq", 0o755), file("opq/a", "a", 0o644), dir("opq/sub", 0o755), file("opq/sub/b", "b", 0o644),
		file("etc/resolv.conf", "nameserver 192.0.2.1\n", 0o644),
		file("etc/hosts", "", 0o644),
	}
	top := []entry{
		file(".wh.gone", "", 0o644),
		file("opq/c", "c", 0o644),
		file("opq/.wh..wh..opq", "", 0o644),
		file("bin/.wh.link", "", 0o644),
	}
	layout := writeLayout(t, [][]byte{gzipped(tarOf(t, base...)), tarOf(t, top...)})
	s := &Store{Dir: t.TempDir(), Logger: testLogger(t)}
	img, err := s.Build(context.Background(), "example/oci:1", BuildOptions{OCILayout: layout})
	if err != nil {
		t.Fatal(err)
	}
	var index struct{ Manifests []struct{ Digest string } }
	b, _ := os.ReadFile(filepath.Join(layout, "index.json"))
	json.Unmarshal(b, &index)
	if img.Digest != index.Manifests[0].Digest {
		t.Errorf("digest %s, want the manifest's %s", img.Digest, index.Manifests[0].Digest)
	}
	for p, want := range map[string]string{
		"/bin/tool":           "regular 755 0:0 links=2",
		"/bin/hard":           "regular 755 0:0 links=2",
		"/bin/su":             "regular 4755 0:0",
		"/shared":             "directory 2775 0:0",
		"/sticky":             "directory 1777 0:0",
		"/home/user":          "directory 750 1000:1000",
		"/home/user/.profile": "regular 600 1000:1000",
		"/dev/null":           "character special 666 0:0",
		"/opq/c":              "regular 644",
	} {
		in, ok := debugfsStat(t, img.Path, p)
		if got := in.String(); !ok || !strings.HasPrefix(got, want) {
			t.Errorf("%s: %s, want %s", p, got, want)
		}
	}
	for _, p := range []string{"/gone", "/opq/a", "/opq/sub", "/bin/link"} {
		if _, ok := debugfsStat(t, img.Path, p); ok {
			t.Errorf("%s survives its whiteout", p)
		}
	}
	if got := debugfsLs(t, img.Path, "/opq"); !slices.Equal(got, []string{"c"}) {
		t.Errorf("/opq holds %v, want [c]", got)
	}
	// The image's resolv.conf is kept; its empty hosts is filled.
	if got := debugfsCat(t, img.Path, "/etc/resolv.conf"); got != "nameserver 192.0.2.1\n" {
		t.Errorf("/etc/resolv.conf: %q", got)
	}
	if got := debugfsCat(t, img.Path, "/etc/hosts"); !strings.Contains(got, "localhost") {
		t.Errorf("/etc/hosts: %q", got)
	}
	if got := debugfsCat(t, img.Path, "/home/user/.profile"); got != "PS1=x" {
		t.Errorf(".profile: %q", got)
	}
}

func TestBuildOCILayoutTags(t *testing.T) {
	needBuild(t)
	one := tarOf(t, file("which", "one", 0o644))
	two := tarOf(t, file("which", "two", 0o644))
	layout := writeLayoutTags(t, map[string][][]byte{"v1": {one}, "v2": {gzipped(two)}})
	s := &Store{Dir: t.TempDir()}
	ctx := context.Background()
	if _, err := s.Build(ctx, "tags", BuildOptions{OCILayout: layout}); err == nil || !strings.Contains(err.Error(), "2 manifests") ||
		!strings.Contains(err.Error(), "tags") || !strings.Contains(err.Error(), "resolving the image") {
		t.Errorf("no tag in a layout of two: %v", err)
	}
	if _, err := s.Build(ctx, "tags", BuildOptions{OCILayout: layout, Tag: "v3"}); err == nil || !strings.Contains(err.Error(), `no manifest named "v3"`) {
		t.Errorf("a missing tag: %v", err)
	}
	img, err := s.Build(ctx, "tags:v2", BuildOptions{OCILayout: layout, Tag: "v2"})
	if err != nil {
		t.Fatal(err)
	}
	if got := debugfsCat(t, img.Path, "/which"); got != "two" {
		t.Errorf("tag v2 built %q", got)
	}
}

func TestBuildOCILayoutCorrupt(t *testing.T) {
	needBuild(t)
	layer := tarOf(t, file("f", "content", 0o644))
	layout := writeLayout(t, [][]byte{layer})
	// Change the layer blob behind its digest, keeping its size.
	blobs, _ := filepath.Glob(filepath.Join(layout, "blobs", "sha256", "*"))
	for _, b := range blobs {
		if data, _ := os.ReadFile(b); string(data) == string(layer) {
			os.WriteFile(b, tarOf(t, file("f", "tampere", 0o644)), 0o644)
		}
	}
	s := &Store{Dir: t.TempDir()}
	_, err := s.Build(context.Background(), "corrupt", BuildOptions{OCILayout: layout})
	if err == nil || !strings.Contains(err.Error(), "content has digest") || !strings.Contains(err.Error(), "building VM image corrupt: extracting the filesystem: layer 1") {
		t.Fatalf("a tampered layer: %v", err)
	}
	if left, _ := os.ReadDir(filepath.Join(s.Dir, "images")); len(left) != 0 {
		t.Errorf("a failed build left %v", left)
	}
}

func TestBuildErrors(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	ctx := context.Background()
	if _, err := s.Build(ctx, "x", BuildOptions{Format: "btrfs"}); err == nil || !strings.Contains(err.Error(), `format "btrfs"`) {
		t.Errorf("format btrfs: %v", err)
	}
	if _, err := s.Build(ctx, "x", BuildOptions{OCILayout: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "building VM image x: resolving the image: OCI layout") {
		t.Errorf("an empty layout: %v", err)
	}
	if _, err := s.Lookup("nothing"); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("Lookup in an empty store: %v", err)
	}
	needDocker(t, busyboxImage)
	_, err := s.Build(ctx, "berth-test/no-such-image:1", BuildOptions{})
	if err == nil || !strings.Contains(err.Error(), "berth-test/no-such-image:1") || !strings.Contains(err.Error(), "has no image") {
		t.Errorf("a missing image: %v", err)
	}
}

func TestPrune(t *testing.T) {
	needBuild(t)
	layout := writeLayout(t, [][]byte{tarOf(t, file("f", "x", 0o644))})
	s := &Store{Dir: t.TempDir()}
	ctx := context.Background()
	img, err := s.Build(ctx, "prune", BuildOptions{OCILayout: layout})
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(s.Dir, "boot", "initramfs-1.0-0000.img")
	os.MkdirAll(filepath.Dir(initrd), 0o755)
	os.WriteFile(initrd, nil, 0o444)
	stale := filepath.Join(s.Dir, "tmp", "sha256-x.ext4-123")
	os.MkdirAll(stale, 0o755)
	old := time.Now().Add(-48 * time.Hour)
	os.Chtimes(stale, old, old)
	if err := s.Prune(time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup("prune"); err != nil {
		t.Fatalf("a build used just now was pruned: %v", err)
	}
	if _, err := os.Stat(initrd); err != nil {
		t.Fatalf("an initramfs used just now was pruned: %v", err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a leftover of a day ago survives: %v", err)
	}
	// Unused for two hours.
	mp := filepath.Join(filepath.Dir(img.Path), "meta.json")
	m, _ := readMeta(mp)
	m.Used = time.Now().Add(-2 * time.Hour)
	writeMeta(mp, m)
	os.Chtimes(initrd, m.Used, m.Used)
	if err := s.Prune(time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup("prune"); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("Lookup after Prune: %v", err)
	}
	if _, err := os.Stat(img.Path); !os.IsNotExist(err) {
		t.Errorf("the file survives Prune: %v", err)
	}
	if _, err := os.Stat(initrd); !os.IsNotExist(err) {
		t.Errorf("the initramfs survives Prune: %v", err)
	}
}

func TestExt4Size(t *testing.T) {
	for _, u := range []contentUsage{{0, 10}, {2 << 20, 300}, {230 << 20, 12000}, {5 << 30, 400000}} {
		size, inodes := ext4Size(u)
		if size < u.bytes+MinFree || size%(1<<20) != 0 || inodes < u.inodes {
			t.Errorf("%+v: %d bytes, %d inodes", u, size, inodes)
		}
		// Not wasteful either: the free space is MinFree and a bounded slack.
		if slack := size - u.bytes - MinFree; slack > u.bytes/3+64<<20 {
			t.Errorf("%+v: %d bytes, %d of slack", u, size, slack)
		}
	}
}

// BenchmarkBuildCached is a Build of an image already built: the
// engine's image lookup and the cache's bookkeeping.
func BenchmarkBuildCached(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		b.Skip("no mkfs.ext4")
	}
	s := &Store{Dir: b.TempDir()}
	ctx := context.Background()
	if _, err := s.Build(ctx, busyboxImage, BuildOptions{}); err != nil {
		b.Skip(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Build(ctx, busyboxImage, BuildOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
