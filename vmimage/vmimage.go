// Package vmimage makes what Berth's microVMs boot: root filesystems
// built from container images (from the Docker engine or an OCI image
// layout directory), cached by the image's digest, and the kernel and
// initramfs that start the in-guest agent (BootFiles). docs/vm-images.md
// tells the whole story.
//
// A root filesystem is built once per (digest, format) and then shared,
// read-only, by every VM of that image: the hypervisor gives each VM a
// copy-on-write overlay of it (a qcow2 file backed by it, or a snapshot
// drive), so a job's writes never reach the cached file.
//
// Everything lives under Store.Dir:
//
//	images/<alg>-<hex>.<format>/root.<format>  a root filesystem, read-only (0444)
//	images/<alg>-<hex>.<format>/meta.json      names, digest, format, size, built, last used
//	boot/initramfs-<kernel>-<key>.img          initramfs files (BootFiles)
//	helpers/helper-<sum>/                      the agent bundles they were made from
//	locks/<key>.lock                           flock(2) per build, across processes
//	tmp/                                       staging directories and partial files
//
// Builds of one key are serialized by its lock file and renamed into
// place complete, so any number of goroutines and processes may share a
// Dir. Building needs root (file owners must be kept), mkfs.ext4 (or
// mkfs.erofs) and, for images of the Docker engine, the engine.
package vmimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/distribution/reference"

	"github.com/berthci/berth/internal/flock"
)

// Store builds and caches VM root filesystems from container images, by
// the image's digest, under Dir. Its methods are safe for concurrent use,
// also by several processes sharing Dir.
type Store struct {
	// Dir holds the cache; default: os.UserCacheDir()/berth/vmimages
	// ($XDG_CACHE_HOME or ~/.cache; /root/.cache/berth/vmimages as root),
	// beside the docker executor's ~/.cache/berth/docker.
	Dir string
	// Logger gets progress lines (Info) and skipped entries (Debug); nil
	// discards them.
	Logger *slog.Logger
}

// Format is the file system of a root filesystem file.
type Format string

const (
	// FormatExt4 is a writable ext4 file system with at least MinFree
	// bytes free (the default).
	FormatExt4 Format = "ext4"
	// FormatEROFS is a read-only, compact erofs file system: the guest
	// needs an overlay (overlayfs over a tmpfs or a scratch disk) to
	// write.
	FormatEROFS Format = "erofs"
)

// MinFree is the free space an ext4 root filesystem has at least, for
// the job's writes through the VM's copy-on-write overlay.
const MinFree = 64 << 20

// Image is one built root filesystem.
type Image struct {
	Name   string `json:"name"`   // as asked, e.g. "berth-test/debian:bookworm"
	Digest string `json:"digest"` // sha256:… of the image: the engine's image ID, or the OCI manifest digest
	Format Format `json:"format"`
	// Path is the root filesystem file, read-only: VMs get a
	// copy-on-write overlay of it.
	Path string `json:"path"`
	Size int64  `json:"size"` // bytes of Path (its apparent size; ext4 files are sparse)
	// Built and Used are when the file was made and last handed out
	// (Build, Lookup); Prune goes by Used.
	Built time.Time `json:"built"`
	Used  time.Time `json:"last_used"`
}

// BuildOptions choose how Build makes a root filesystem.
type BuildOptions struct {
	Format Format // "" is FormatExt4
	// OCILayout builds from an OCI image layout directory (oci-layout,
	// index.json, blobs/) instead of the Docker engine.
	OCILayout string
	// Tag picks the manifest of an OCI layout with several: its
	// org.opencontainers.image.ref.name annotation.
	Tag string
}

// ErrNotBuilt is returned by Lookup for an image that has no build.
var ErrNotBuilt = errors.New("VM image not built")

// meta is meta.json beside a root filesystem.
type meta struct {
	Name   string    `json:"name"`  // as first asked
	Names  []string  `json:"names"` // every normalized name it was asked by
	Digest string    `json:"digest"`
	Format Format    `json:"format"`
	Size   int64     `json:"size"`
	Source string    `json:"source"` // "docker" or "oci:<dir>"
	Built  time.Time `json:"built"`
	Used   time.Time `json:"last_used"`
	// BuildSeconds is how long the build took.
	BuildSeconds float64 `json:"build_seconds"`
}

func (s *Store) log() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// Root returns the store's directory, absolute (Dir or its default).
func (s *Store) Root() (string, error) { return s.dir() }

// dir returns the absolute cache directory.
func (s *Store) dir() (string, error) {
	d := s.Dir
	if d == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("no cache directory (set Store.Dir): %w", err)
		}
		d = filepath.Join(base, "berth", "vmimages")
	}
	return filepath.Abs(d)
}

// buildLayout versions what Build adds to an image's filesystem: a new
// layout builds images again instead of using the cache.
const buildLayout = "2"

// key is the directory name of a build.
func key(digest string, f Format) string {
	return strings.ReplaceAll(digest, ":", "-") + "." + string(f) + ".v" + buildLayout
}

// Build returns the root filesystem of the image ref, building it unless
// a build of the image's digest in that format is cached. From the
// Docker engine, ref is an image the engine has (it is not pulled); from
// an OCI layout, ref only names the result (the manifest is chosen by
// o.Tag). Concurrent Builds of one digest build it once; each Build marks
// it used. Errors name the image and the step.
func (s *Store) Build(ctx context.Context, ref string, o BuildOptions) (*Image, error) {
	if o.Format == "" {
		o.Format = FormatExt4
	}
	wrap := func(step string, err error) error {
		return fmt.Errorf("building VM image %s: %s: %w", ref, step, err)
	}
	if o.Format != FormatExt4 && o.Format != FormatEROFS {
		return nil, wrap("options", fmt.Errorf("format %q: want ext4 or erofs", o.Format))
	}
	dir, err := s.dir()
	if err != nil {
		return nil, wrap("store", err)
	}
	var src source
	if o.OCILayout != "" {
		src, err = openOCILayout(o.OCILayout, o.Tag)
	} else {
		src, err = openDocker(ctx, ref)
	}
	if err != nil {
		return nil, wrap("resolving the image", err)
	}
	defer src.Close()
	k := key(src.Digest(), o.Format)
	bdir := filepath.Join(dir, "images", k)
	if img, err := s.use(ctx, bdir, k, ref); err == nil {
		return img, nil
	}
	unlock, err := s.lock(ctx, k)
	if err != nil {
		return nil, wrap("locking", err)
	}
	defer unlock()
	// A build that finished while this one waited for the lock.
	if img, err := s.useLocked(bdir, ref); err == nil {
		return img, nil
	}
	if os.Geteuid() != 0 {
		return nil, wrap("checking privileges", errors.New("building VM images needs root: the image's file owners, modes and device nodes must be kept"))
	}
	start := time.Now()
	tmpRoot := filepath.Join(dir, "tmp")
	if err := os.MkdirAll(tmpRoot, 0o700); err != nil {
		return nil, wrap("staging", err)
	}
	work, err := os.MkdirTemp(tmpRoot, k+"-")
	if err != nil {
		return nil, wrap("staging", err)
	}
	defer os.RemoveAll(work)
	staging := filepath.Join(work, "rootfs")
	if err := os.Mkdir(staging, 0o755); err != nil {
		return nil, wrap("staging", err)
	}
	log := s.log().With("image", ref, "digest", src.Digest())
	log.Info("extracting the image's filesystem", "source", src.Kind())
	x := newExtractor(staging, log)
	if err := src.Extract(ctx, x); err != nil {
		return nil, wrap("extracting the filesystem", err)
	}
	if err := x.finish(); err != nil {
		return nil, wrap("extracting the filesystem", err)
	}
	log.Info("extracted", "files", x.entries, "took", time.Since(start).Round(time.Millisecond))
	if err := prepareGuest(x, src.Kind() == "docker", src.Config()); err != nil {
		return nil, wrap("adding what the guest needs", err)
	}
	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, wrap("staging", err)
	}
	file := filepath.Join(out, "root."+string(o.Format))
	mkStart := time.Now()
	log.Info("making the filesystem", "format", o.Format)
	if err := makeFS(ctx, o.Format, staging, file, log); err != nil {
		return nil, wrap("making the "+string(o.Format)+" file", err)
	}
	fi, err := os.Stat(file)
	if err != nil {
		return nil, wrap("making the "+string(o.Format)+" file", err)
	}
	if err := os.Chmod(file, 0o444); err != nil {
		return nil, wrap("making the "+string(o.Format)+" file", err)
	}
	now := time.Now()
	m := &meta{Name: ref, Names: []string{normalizeName(ref)}, Digest: src.Digest(), Format: o.Format, Size: fi.Size(),
		Source: src.Kind(), Built: now, Used: now, BuildSeconds: now.Sub(start).Seconds()}
	if err := writeMeta(filepath.Join(out, "meta.json"), m); err != nil {
		return nil, wrap("writing meta.json", err)
	}
	if err := os.MkdirAll(filepath.Dir(bdir), 0o755); err != nil {
		return nil, wrap("storing", err)
	}
	_ = os.RemoveAll(bdir) // a broken build without meta.json
	if err := os.Rename(out, bdir); err != nil {
		return nil, wrap("storing", err)
	}
	log.Info("built the VM image", "format", o.Format, "path", filepath.Join(bdir, "root."+string(o.Format)),
		"bytes", fi.Size(), "mkfs", time.Since(mkStart).Round(time.Millisecond), "took", time.Since(start).Round(time.Millisecond))
	return m.image(bdir, ref), nil
}

// use returns the cached build in bdir, marking it used, or an error when
// there is none.
func (s *Store) use(ctx context.Context, bdir, k, ref string) (*Image, error) {
	if _, err := os.Stat(filepath.Join(bdir, "meta.json")); err != nil {
		return nil, err
	}
	unlock, err := s.lock(ctx, k)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return s.useLocked(bdir, ref)
}

// useLocked is use with the build's lock held.
func (s *Store) useLocked(bdir, ref string) (*Image, error) {
	m, err := readMeta(filepath.Join(bdir, "meta.json"))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(bdir, "root."+string(m.Format))); err != nil {
		return nil, err
	}
	m.Used = time.Now()
	if n := normalizeName(ref); ref != m.Digest && !slices.Contains(m.Names, n) {
		m.Names = append(m.Names, n)
	}
	if err := writeMeta(filepath.Join(bdir, "meta.json"), m); err != nil {
		s.log().Warn("recording the use of a VM image", "path", bdir, "err", err)
	}
	return m.image(bdir, ref), nil
}

func (m *meta) image(bdir, ref string) *Image {
	if ref == "" {
		ref = m.Name
	}
	return &Image{Name: ref, Digest: m.Digest, Format: m.Format, Path: filepath.Join(bdir, "root."+string(m.Format)),
		Size: m.Size, Built: m.Built, Used: m.Used}
}

// Lookup returns the newest build for a name (normalized as Docker
// does: "busybox" is "docker.io/library/busybox:latest") or a digest
// ("sha256:…"), in any format, marking it used; ErrNotBuilt if there is
// none. It needs neither the engine nor the image.
func (s *Store) Lookup(ref string) (*Image, error) {
	builds, err := s.builds()
	if err != nil {
		return nil, fmt.Errorf("looking up VM image %s: %w", ref, err)
	}
	n := normalizeName(ref)
	var best *build
	for _, b := range builds {
		if (b.m.Digest == ref || slices.Contains(b.m.Names, n)) && (best == nil || b.m.Built.After(best.m.Built)) {
			best = b
		}
	}
	if best == nil {
		return nil, fmt.Errorf("looking up VM image %s: %w", ref, ErrNotBuilt)
	}
	img, err := s.use(context.Background(), best.dir, filepath.Base(best.dir), ref)
	if err != nil {
		return nil, fmt.Errorf("looking up VM image %s: %w", ref, err)
	}
	return img, nil
}

// List returns every build, by name and then newest first.
func (s *Store) List() ([]*Image, error) {
	builds, err := s.builds()
	if err != nil {
		return nil, fmt.Errorf("listing VM images: %w", err)
	}
	var out []*Image
	for _, b := range builds {
		out = append(out, b.m.image(b.dir, ""))
	}
	slices.SortFunc(out, func(a, b *Image) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return b.Built.Compare(a.Built)
	})
	return out, nil
}

type build struct {
	dir string
	m   *meta
}

// builds reads the meta.json of every complete build.
func (s *Store) builds() ([]*build, error) {
	dir, err := s.dir()
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Join(dir, "images"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*build
	for _, e := range entries {
		d := filepath.Join(dir, "images", e.Name())
		m, err := readMeta(filepath.Join(d, "meta.json"))
		if err != nil {
			continue
		}
		out = append(out, &build{dir: d, m: m})
	}
	return out, nil
}

// Prune removes the builds and initramfs files not used for keep, and
// leftovers of interrupted builds older than a day. A VM that has its
// root filesystem open keeps it (the file is only unlinked), but a VM
// started later cannot use it: keep should exceed the longest job.
func (s *Store) Prune(keep time.Duration) error {
	dir, err := s.dir()
	if err != nil {
		return fmt.Errorf("pruning VM images: %w", err)
	}
	builds, err := s.builds()
	if err != nil {
		return fmt.Errorf("pruning VM images: %w", err)
	}
	var errs []error
	for _, b := range builds {
		if time.Since(b.m.Used) <= keep {
			continue
		}
		k := filepath.Base(b.dir)
		unlock, err := s.lock(context.Background(), k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// Used again since it was read?
		if m, err := readMeta(filepath.Join(b.dir, "meta.json")); err == nil && time.Since(m.Used) > keep {
			if err := os.RemoveAll(b.dir); err != nil {
				errs = append(errs, err)
			} else {
				s.log().Info("pruned a VM image", "name", m.Name, "digest", m.Digest, "format", m.Format, "last_used", m.Used)
			}
		}
		unlock()
	}
	boots, _ := filepath.Glob(filepath.Join(dir, "boot", "initramfs-*.img"))
	kernels, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinux-*"))
	for _, p := range append(boots, kernels...) {
		k := strings.TrimSuffix(filepath.Base(p), ".img")
		unlock, err := s.lock(context.Background(), k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if fi, err := os.Stat(p); err == nil && time.Since(fi.ModTime()) > keep {
			if err := os.Remove(p); err != nil {
				errs = append(errs, err)
			} else {
				s.log().Info("pruned a boot file", "path", p)
			}
		}
		unlock()
	}
	for _, sub := range []string{"tmp", "boot"} {
		entries, _ := os.ReadDir(filepath.Join(dir, sub))
		for _, e := range entries {
			if sub == "boot" && !strings.HasPrefix(e.Name(), ".") {
				continue
			}
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > 24*time.Hour {
				_ = os.RemoveAll(filepath.Join(dir, sub, e.Name()))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("pruning VM images: %w", err)
	}
	return nil
}

// lock takes the lock file of key (flock(2): it is released when the
// process dies), waiting until ctx is done.
func (s *Store) lock(ctx context.Context, key string) (func(), error) {
	dir, err := s.dir()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "locks"), 0o755); err != nil {
		return nil, err
	}
	f, err := flock.Lock(ctx, filepath.Join(dir, "locks", key+".lock"), 0o644, 50*time.Millisecond)
	if err != nil {
		return nil, err
	}
	return func() { f.Close() }, nil
}

func readMeta(p string) (*meta, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return &m, nil
}

// writeMeta replaces p atomically.
func writeMeta(p string, m *meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".meta-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}

// normalizeName is a Docker reference in its full form
// ("docker.io/library/busybox:latest"), or ref itself when it is not one.
func normalizeName(ref string) string {
	if n, err := reference.ParseNormalizedNamed(ref); err == nil {
		return reference.TagNameOnly(n).String()
	}
	return ref
}

// touch marks p used (its modification time) and reports whether it
// exists.
func touch(p string) bool {
	now := time.Now()
	return os.Chtimes(p, now, now) == nil
}

func sha256File(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
