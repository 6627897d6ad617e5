package docker

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"
)

// helperFill is where the filler container mounts the helper volume.
const helperFill = "/berth-helper-fill"

var fillLocks sync.Map // volume name → *sync.Mutex

// ensureHelperVolume makes sure the helper volume (Options.HelperVolume)
// holds the helper bundle, filling it through the Engine API once per
// engine and bundle: a container of image (any image the engine has; it
// is created, never started) mounts the volume, the bundle is copied in
// as a tar archive, and a second, empty volume named <volume>.complete
// marks it done — volumes cannot be relabelled, and a marker created last
// means a fill that broke off (a runner killed mid-copy) is never taken
// for a complete one: it is removed and done again.
func (p *Provider) ensureHelperVolume(ctx context.Context, image string) error {
	if p.helperVolume == "" {
		return nil
	}
	p.helperMu.Lock()
	defer p.helperMu.Unlock()
	if p.helperReady {
		return nil
	}
	// Providers of one process fill one volume name one after another:
	// instances that share an engine (the local plugin) must not remove
	// a volume another is filling.
	l, _ := fillLocks.LoadOrStore(p.helperVolume, new(sync.Mutex))
	l.(*sync.Mutex).Lock()
	defer l.(*sync.Mutex).Unlock()
	mctx, cancel := detached(ctx)
	defer cancel()
	marker := p.helperVolume + ".complete"
	if _, err := p.cli.VolumeInspect(mctx, marker); err == nil {
		p.helperReady = true
		return nil
	}
	wrap := func(err error) error { return fmt.Errorf("putting the helper into volume %s: %w", p.helperVolume, err) }
	_ = p.cli.VolumeRemove(mctx, p.helperVolume, true) // a broken-off fill
	labels := map[string]string{LabelManaged: "true", LabelType: "helper"}
	if _, err := p.cli.VolumeCreate(mctx, volume.CreateOptions{Name: p.helperVolume, Labels: labels}); err != nil {
		return wrap(err)
	}
	resp, err := p.cli.ContainerCreate(mctx,
		&container.Config{Image: image, Entrypoint: []string{helperFill + "/berth"}, Labels: labels},
		&container.HostConfig{Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: p.helperVolume, Target: helperFill}}},
		nil, nil, "")
	if err != nil {
		return wrap(err)
	}
	defer p.cli.ContainerRemove(context.WithoutCancel(mctx), resp.ID, container.RemoveOptions{Force: true})
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarDir(pw, p.helperDir)) }()
	err = p.cli.CopyToContainer(mctx, resp.ID, helperFill, pr, container.CopyToContainerOptions{})
	pr.CloseWithError(err)
	if err != nil {
		return wrap(err)
	}
	if _, err := p.cli.VolumeCreate(mctx, volume.CreateOptions{Name: marker, Labels: labels}); err != nil {
		return wrap(err)
	}
	p.helperReady = true
	p.log.Info("helper copied into a volume of the Docker engine", "volume", p.helperVolume)
	return nil
}

// tarDir writes the files, directories and symbolic links under dir as a
// tar archive with paths relative to dir (the bundle's .complete marker
// left out).
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." || rel == ".complete" {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(tw, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
