package vmimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Helpers shared by the tests: test logs, tar archives, OCI layouts and
// reading ext4 files with debugfs.

// logLines is a Logger's output, kept for assertions and shown with
// the test's log.
type logLines struct {
	t  testing.TB
	mu sync.Mutex
	b  strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.b.Write(p)
	l.mu.Unlock()
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(&logLines{t: t}, nil))
}

func countingLogger(t testing.TB) (*slog.Logger, *logLines) {
	l := &logLines{t: t}
	return slog.New(slog.NewTextHandler(l, nil)), l
}

// entry is a tar entry for tarOf.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
	major, minor     int64
}

func dir(name string, mode int64) entry { return entry{name: name, typ: tar.TypeDir, mode: mode} }
func file(name, body string, mode int64) entry {
	return entry{name: name, body: body, typ: tar.TypeReg, mode: mode}
}
func symlink(name, target string) entry {
	return entry{name: name, link: target, typ: tar.TypeSymlink, mode: 0o777}
}
func hardlink(name, target string) entry {
	return entry{name: name, link: target, typ: tar.TypeLink, mode: 0o644}
}

var testTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

func tarOf(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			ModTime: testTime, Size: int64(len(e.body)), Devmajor: e.major, Devminor: e.minor, Format: tar.FormatPAX}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte(e.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// busyboxLayers is a busybox root filesystem as one gzip layer.
func busyboxLayers(t testing.TB) [][]byte {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	es := []entry{dir("bin", 0o755), file("bin/busybox", string(bb), 0o755), dir("etc", 0o755), dir("root", 0o700), dir("tmp", 0o1777),
		file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644), file("etc/group", "root:x:0:\n", 0o644)}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" {
			es = append(es, symlink("bin/"+a, "busybox"))
		}
	}
	return [][]byte{gzipped(tarOf(t, es...))}
}

// writeLayout writes an OCI image layout with one untagged manifest of
// the layers (gzip-compressed ones by their magic).
func writeLayout(t testing.TB, layers [][]byte) string {
	return writeLayoutTags(t, map[string][][]byte{"": layers})
}

// writeLayoutTags writes an OCI image layout with a manifest per tag
// ("": no org.opencontainers.image.ref.name).
func writeLayoutTags(t testing.TB, tags map[string][][]byte) string {
	t.Helper()
	dir := t.TempDir()
	blob := func(b []byte, mediaType string) ocispec.Descriptor {
		sum := sha256.Sum256(b)
		enc := hex.EncodeToString(sum[:])
		p := filepath.Join(dir, "blobs", "sha256", enc)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return ocispec.Descriptor{MediaType: mediaType, Digest: digest.NewDigestFromEncoded(digest.SHA256, enc), Size: int64(len(b))}
	}
	mustJSON := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var index ocispec.Index
	index.SchemaVersion = 2
	index.MediaType = ocispec.MediaTypeImageIndex
	names := make([]string, 0, len(tags))
	for n := range tags {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, tag := range names {
		cfg := blob(mustJSON(map[string]any{"architecture": "amd64", "os": "linux", "rootfs": map[string]any{"type": "layers"}}), ocispec.MediaTypeImageConfig)
		var m ocispec.Manifest
		m.SchemaVersion = 2
		m.MediaType = ocispec.MediaTypeImageManifest
		m.Config = cfg
		for _, l := range tags[tag] {
			mt := ocispec.MediaTypeImageLayer
			if bytes.HasPrefix(l, []byte{0x1f, 0x8b}) {
				mt = ocispec.MediaTypeImageLayerGzip
			}
			m.Layers = append(m.Layers, blob(l, mt))
		}
		d := blob(mustJSON(m), ocispec.MediaTypeImageManifest)
		if tag != "" {
			d.Annotations = map[string]string{ocispec.AnnotationRefName: tag}
		}
		index.Manifests = append(index.Manifests, d)
	}
	os.WriteFile(filepath.Join(dir, "index.json"), mustJSON(index), 0o644)
	os.WriteFile(filepath.Join(dir, ocispec.ImageLayoutFile), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
	return dir
}

// inode is what debugfs says of a path in an ext4 file.
type inode struct {
	typ        string // regular, directory, symlink, character special, …
	mode       int64  // permission bits with setuid, setgid, sticky
	uid, gid   int
	links      int
	ino        int
	size       int64
	fastTarget string // a short symlink's target
}

var (
	reInode = regexp.MustCompile(`Inode: (\d+)\s+Type: (.+?)\s+Mode:\s+(\d+)`)
	reUser  = regexp.MustCompile(`User:\s+(\d+)\s+Group:\s+(\d+)`)
	reLinks = regexp.MustCompile(`Links: (\d+)`)
	reSize  = regexp.MustCompile(`Size: (\d+)`)
	reFast  = regexp.MustCompile(`Fast link dest: "(.*)"`)
)

// debugfsStat reads the inode of p in the ext4 file fs (false: no such
// path).
func debugfsStat(t testing.TB, fs, p string) (inode, bool) {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "stat "+p, fs).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs stat %s: %v\n%s", p, err, out)
	}
	m := reInode.FindStringSubmatch(string(out))
	if m == nil {
		return inode{}, false
	}
	var in inode
	in.ino, _ = strconv.Atoi(m[1])
	in.typ = m[2]
	in.mode, _ = strconv.ParseInt(m[3], 8, 64)
	if u := reUser.FindStringSubmatch(string(out)); u != nil {
		in.uid, _ = strconv.Atoi(u[1])
		in.gid, _ = strconv.Atoi(u[2])
	}
	if l := reLinks.FindStringSubmatch(string(out)); l != nil {
		in.links, _ = strconv.Atoi(l[1])
	}
	if s := reSize.FindStringSubmatch(string(out)); s != nil {
		in.size, _ = strconv.ParseInt(s[1], 10, 64)
	}
	if f := reFast.FindStringSubmatch(string(out)); f != nil {
		in.fastTarget = f[1]
	}
	return in, true
}

// debugfsCat is the content of p in the ext4 file fs.
func debugfsCat(t testing.TB, fs, p string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "cat "+p, fs).Output()
	if err != nil {
		t.Fatalf("debugfs cat %s: %v", p, err)
	}
	return string(out)
}

// debugfsLs lists the names in directory p of the ext4 file fs.
func debugfsLs(t testing.TB, fs, p string) []string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "ls "+p, fs).Output()
	if err != nil {
		t.Fatalf("debugfs ls %s: %v", p, err)
	}
	// "ls" prints " <ino>  (reclen) name   <ino>  (reclen) name ..."
	var names []string
	re := regexp.MustCompile(`\d+\s+\(\d+\)\s+(\S+)`)
	for _, m := range re.FindAllStringSubmatch(string(out), -1) {
		if m[1] != "." && m[1] != ".." {
			names = append(names, m[1])
		}
	}
	slices.Sort(names)
	return names
}

func (in inode) String() string {
	return fmt.Sprintf("%s %o %d:%d links=%d", in.typ, in.mode, in.uid, in.gid, in.links)
}
