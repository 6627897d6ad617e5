package vmimage

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/berthci/berth/guest"
)

// source is where an image's filesystem comes from.
type source interface {
	// Digest identifies the image: the engine's image ID or the OCI
	// manifest digest.
	Digest() string
	// Kind is "docker" or "oci".
	Kind() string
	// Config is how the image says to run it.
	Config() guest.ImageConfig
	// Extract writes the image's filesystem into x.
	Extract(ctx context.Context, x *extractor) error
	Close() error
}

// dockerSource is an image of the Docker engine: its filesystem is the
// export of a container created (never started) from it.
type dockerSource struct {
	cli *client.Client
	ref string
	id  string
	cfg guest.ImageConfig
}

func openDocker(ctx context.Context, ref string) (*dockerSource, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("docker engine: %w", err)
	}
	img, err := cli.ImageInspect(ctx, ref)
	if err != nil {
		cli.Close()
		if client.IsErrNotFound(err) {
			return nil, fmt.Errorf("the Docker engine has no image %s (pull or build it first): %w", ref, err)
		}
		return nil, fmt.Errorf("docker engine: inspecting the image: %w", err)
	}
	d := &dockerSource{cli: cli, ref: ref, id: img.ID}
	if c := img.Config; c != nil {
		d.cfg = guest.ImageConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User}
	}
	return d, nil
}

func (d *dockerSource) Digest() string { return d.id }
func (d *dockerSource) Kind() string   { return "docker" }

func (d *dockerSource) Config() guest.ImageConfig { return d.cfg }
func (d *dockerSource) Close() error              { return d.cli.Close() }

func (d *dockerSource) Extract(ctx context.Context, x *extractor) error {
	// By ID, so the filesystem is the digest's even if the tag moves. The
	// entrypoint is never run: it only lets images without a command be
	// created.
	resp, err := d.cli.ContainerCreate(ctx, &container.Config{
		Image:           d.id,
		Entrypoint:      []string{"/nonexistent"},
		NetworkDisabled: true,
		Labels:          map[string]string{"berth.vmimage": "export"},
	}, &container.HostConfig{}, nil, nil, "")
	if err != nil {
		return fmt.Errorf("creating a container to export: %w", err)
	}
	defer func() {
		if err := d.cli.ContainerRemove(context.WithoutCancel(ctx), resp.ID, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
			x.log.Warn("removing the export container", "container", resp.ID, "err", err)
		}
	}()
	rc, err := d.cli.ContainerExport(ctx, resp.ID)
	if err != nil {
		return fmt.Errorf("exporting container %.12s: %w", resp.ID, err)
	}
	defer rc.Close()
	if err := x.apply(rc, false); err != nil {
		return fmt.Errorf("container export: %w", err)
	}
	return nil
}

// ociSource is one image manifest of an OCI image layout directory.
type ociSource struct {
	dir      string
	manifest ocispec.Descriptor
	cfg      guest.ImageConfig
}

// Media types of image indexes and manifests, OCI's and Docker's.
const (
	dockerManifestList = "application/vnd.docker.distribution.manifest.list.v2+json"
	dockerManifest     = "application/vnd.docker.distribution.manifest.v2+json"
)

func openOCILayout(dir, tag string) (*ociSource, error) {
	wrap := func(err error) error { return fmt.Errorf("OCI layout %s: %w", dir, err) }
	var layout ocispec.ImageLayout
	if err := readJSON(filepath.Join(dir, ocispec.ImageLayoutFile), &layout); err != nil {
		return nil, wrap(err)
	}
	if layout.Version != ocispec.ImageLayoutVersion {
		return nil, wrap(fmt.Errorf("imageLayoutVersion %q, want %q", layout.Version, ocispec.ImageLayoutVersion))
	}
	var index ocispec.Index
	if err := readJSON(filepath.Join(dir, "index.json"), &index); err != nil {
		return nil, wrap(err)
	}
	var picked []ocispec.Descriptor
	var names []string
	for _, d := range index.Manifests {
		name := d.Annotations[ocispec.AnnotationRefName]
		names = append(names, fmt.Sprintf("%q", name))
		if tag == "" || name == tag {
			picked = append(picked, d)
		}
	}
	switch {
	case len(picked) == 0 && tag != "":
		return nil, wrap(fmt.Errorf("no manifest named %q (there are %s)", tag, strings.Join(names, ", ")))
	case len(picked) == 0:
		return nil, wrap(errors.New("index.json lists no manifest"))
	case len(picked) > 1:
		return nil, wrap(fmt.Errorf("%d manifests (%s): choose one by its org.opencontainers.image.ref.name", len(picked), strings.Join(names, ", ")))
	}
	m, err := resolveManifest(dir, picked[0], 0)
	if err != nil {
		return nil, wrap(err)
	}
	o := &ociSource{dir: dir, manifest: m}
	var man ocispec.Manifest
	if err := readBlobJSON(dir, m, &man); err != nil {
		return nil, wrap(err)
	}
	var img ocispec.Image
	if err := readBlobJSON(dir, man.Config, &img); err != nil {
		return nil, wrap(fmt.Errorf("image config: %w", err))
	}
	o.cfg = guest.ImageConfig{Env: img.Config.Env, WorkingDir: img.Config.WorkingDir, User: img.Config.User}
	return o, nil
}

// resolveManifest follows image indexes down to the manifest of this
// machine's platform.
func resolveManifest(dir string, d ocispec.Descriptor, depth int) (ocispec.Descriptor, error) {
	switch d.MediaType {
	case ocispec.MediaTypeImageManifest, dockerManifest:
		return d, nil
	case ocispec.MediaTypeImageIndex, dockerManifestList:
	default:
		return d, fmt.Errorf("descriptor %s: media type %q is neither a manifest nor an index", d.Digest, d.MediaType)
	}
	if depth > 4 {
		return d, errors.New("image indexes nested too deep")
	}
	var idx ocispec.Index
	if err := readBlobJSON(dir, d, &idx); err != nil {
		return d, err
	}
	var found []string
	for _, m := range idx.Manifests {
		if p := m.Platform; p != nil {
			found = append(found, p.OS+"/"+p.Architecture)
			if p.OS != "linux" || p.Architecture != runtime.GOARCH {
				continue
			}
		}
		return resolveManifest(dir, m, depth+1)
	}
	return d, fmt.Errorf("index %s has no manifest for linux/%s (it has %s)", d.Digest, runtime.GOARCH, strings.Join(found, ", "))
}

func (o *ociSource) Digest() string { return o.manifest.Digest.String() }
func (o *ociSource) Kind() string   { return "oci:" + o.dir }

func (o *ociSource) Config() guest.ImageConfig { return o.cfg }
func (o *ociSource) Close() error              { return nil }

func (o *ociSource) Extract(ctx context.Context, x *extractor) error {
	var m ocispec.Manifest
	if err := readBlobJSON(o.dir, o.manifest, &m); err != nil {
		return err
	}
	for i, l := range m.Layers {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := o.applyLayer(l, x); err != nil {
			return fmt.Errorf("layer %d (%s): %w", i+1, l.Digest, err)
		}
	}
	return nil
}

// applyLayer applies one layer blob: a tar archive, plain or gzip
// compressed, with whiteouts. The blob's digest is checked as it is read.
func (o *ociSource) applyLayer(l ocispec.Descriptor, x *extractor) error {
	switch l.MediaType {
	case ocispec.MediaTypeImageLayer, ocispec.MediaTypeImageLayerGzip,
		ocispec.MediaTypeImageLayerNonDistributable, ocispec.MediaTypeImageLayerNonDistributableGzip, //nolint:staticcheck // still found in layouts
		"application/vnd.docker.image.rootfs.diff.tar", "application/vnd.docker.image.rootfs.diff.tar.gzip",
		"application/vnd.docker.image.rootfs.foreign.diff.tar.gzip":
	case ocispec.MediaTypeImageLayerZstd, ocispec.MediaTypeImageLayerNonDistributableZstd: //nolint:staticcheck
		return fmt.Errorf("media type %s: zstd layers are not supported", l.MediaType)
	default:
		return fmt.Errorf("media type %q is not a layer", l.MediaType)
	}
	f, v, err := openBlob(o.dir, l)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReaderSize(io.TeeReader(f, v), 1<<16)
	var r io.Reader = br
	// By content, not by media type: some tools mislabel.
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	}
	if err := x.apply(r, true); err != nil {
		return err
	}
	// What follows the tar archive's end, so the whole blob is verified.
	if _, err := io.Copy(io.Discard, br); err != nil {
		return err
	}
	return v.check()
}

// blobVerifier hashes a blob as it is read and checks it against its
// descriptor.
type blobVerifier struct {
	want digest.Digest
	size int64
	n    int64
	h    hash.Hash
}

func (v *blobVerifier) Write(p []byte) (int, error) {
	v.n += int64(len(p))
	return v.h.Write(p)
}

func (v *blobVerifier) check() error {
	if v.size > 0 && v.n != v.size {
		return fmt.Errorf("blob %s: %d bytes, the descriptor says %d", v.want, v.n, v.size)
	}
	if got := digest.NewDigestFromBytes(v.want.Algorithm(), v.h.Sum(nil)); got != v.want {
		return fmt.Errorf("blob %s: content has digest %s", v.want, got)
	}
	return nil
}

// openBlob opens the blob of d, after checking the digest's form (which
// keeps the path inside blobs/).
func openBlob(dir string, d ocispec.Descriptor) (*os.File, *blobVerifier, error) {
	if err := d.Digest.Validate(); err != nil {
		return nil, nil, fmt.Errorf("descriptor digest %q: %w", d.Digest, err)
	}
	if !d.Digest.Algorithm().Available() {
		return nil, nil, fmt.Errorf("descriptor digest %q: algorithm not available", d.Digest)
	}
	f, err := os.Open(filepath.Join(dir, "blobs", d.Digest.Algorithm().String(), d.Digest.Encoded()))
	if err != nil {
		return nil, nil, err
	}
	return f, &blobVerifier{want: d.Digest, size: d.Size, h: d.Digest.Algorithm().Hash()}, nil
}

// readBlobJSON reads a (small, verified) JSON blob.
func readBlobJSON(dir string, d ocispec.Descriptor, v any) error {
	f, ver, err := openBlob(dir, d)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.TeeReader(io.LimitReader(f, 8<<20), ver))
	if err != nil {
		return err
	}
	if err := ver.check(); err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("blob %s: %w", d.Digest, err)
	}
	return nil
}

func readJSON(p string, v any) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(p), err)
	}
	return nil
}
