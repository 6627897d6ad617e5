package helper

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/berthci/berth/runner/network"
)

// CacheArchive zips the selection of dir into file (atomically: a
// temporary file beside it, then rename). A selection without files leaves
// file as it was and is not an error.
func CacheArchive(ctx context.Context, out io.Writer, file, dir string, sel Selection) error {
	files, err := Files(dir, sel)
	if err != nil {
		return fmt.Errorf("selecting cache files: %w", err)
	}
	if len(files) == 0 {
		fmt.Fprintln(out, "WARNING: no matching files for the cache; nothing archived")
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".cache-*.zip")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	n, err := CreateZip(tmp, dir, files)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("creating cache archive: %w", err)
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return err
	}
	fmt.Fprintf(out, "Created cache archive with %d entries\n", n)
	return nil
}

// CacheExtract extracts the first of files that exists (the cache key,
// then its fallback keys) into dir. No cache at all is not an error.
func CacheExtract(ctx context.Context, out io.Writer, files []string, dir string) error {
	for i, f := range files {
		if _, err := os.Stat(f); err != nil {
			continue
		}
		if i > 0 {
			fmt.Fprintf(out, "Using fallback cache %s\n", filepath.Base(filepath.Dir(f)))
		}
		n, err := ExtractZip(f, dir)
		if err != nil {
			return fmt.Errorf("extracting cache: %w", err)
		}
		fmt.Fprintf(out, "Successfully extracted cache (%d entries)\n", n)
		return nil
	}
	fmt.Fprintln(out, "WARNING: Cache not found; continuing without it")
	return nil
}

// UploadOptions describe one artifact upload.
type UploadOptions struct {
	Name     string // artifact name (file name without extension)
	Format   string // zip (default), gzip, raw
	Type     string // artifact_type (default archive)
	ExpireIn string
}

// ArtifactsUpload archives the selection of dir and uploads it for job jc.
func ArtifactsUpload(ctx context.Context, out io.Writer, c *network.Client, jc network.JobCredentials, dir string, sel Selection, opts UploadOptions) error {
	files, err := Files(dir, sel)
	if err != nil {
		return fmt.Errorf("selecting artifact files: %w", err)
	}
	regular := 0
	for _, f := range files {
		if f[len(f)-1] != '/' {
			regular++
		}
	}
	if regular == 0 {
		fmt.Fprintln(out, "WARNING: no matching files. Ensure that the artifact path is relative to the working directory")
		fmt.Fprintln(out, "ERROR: No files to upload")
		return nil
	}
	format := opts.Format
	if format == "" {
		format = "zip"
	}
	name := opts.Name
	if name == "" {
		name = "artifacts"
	}
	tmp := &spool{}
	defer tmp.Close()
	var filename string
	switch format {
	case "zip":
		filename = name + ".zip"
		_, err = CreateZip(tmp, dir, files)
	case "gzip":
		filename = name + ".gz"
		err = createGzip(tmp, dir, files)
	case "raw":
		if regular != 1 {
			return fmt.Errorf("artifact format raw takes exactly one file, %d matched", regular)
		}
		filename = filepath.Base(files[0])
		var src *os.File
		if src, err = os.Open(filepath.Join(dir, files[0])); err == nil {
			_, err = io.Copy(tmp, src)
			src.Close()
		}
	default:
		return fmt.Errorf("artifact format %q is not supported (zip, gzip, raw)", format)
	}
	if err != nil {
		return fmt.Errorf("creating artifact archive: %w", err)
	}
	fmt.Fprintf(out, "%s: found %d matching artifact files and directories\n", name, len(files))
	err = c.UploadArtifact(ctx, jc, tmp.Open,
		network.ArtifactOptions{Name: filename, Type: opts.Type, Format: format, ExpireIn: opts.ExpireIn})
	if err != nil {
		return fmt.Errorf("uploading artifacts: %w", err)
	}
	fmt.Fprintf(out, "Uploading artifacts as %q to coordinator... 201 Created  id=%d size=%d\n", format, jc.ID, tmp.Size())
	return nil
}

func createGzip(w io.Writer, dir string, files []string) error {
	for _, f := range files {
		if f[len(f)-1] == '/' {
			continue
		}
		src, err := os.Open(filepath.Join(dir, filepath.FromSlash(f)))
		if err != nil {
			return err
		}
		zw := gzip.NewWriter(w)
		zw.Name = f
		_, err = io.Copy(zw, src)
		src.Close()
		if cerr := zw.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// downloadAttempts bounds the downloads of one artifact archive whose body
// broke off (the network client already retries a request that fails
// before its body).
const downloadAttempts = 3

// ArtifactsDownload downloads the archive of job jc and extracts it into
// dir. A transfer that breaks off mid-body, or an archive that arrives
// short, is downloaded again (up to 3 times, 1 s then 2 s apart).
func ArtifactsDownload(ctx context.Context, out io.Writer, c *network.Client, jc network.JobCredentials, dir string) error {
	for attempt := 1; ; attempt++ {
		err := artifactsDownload(ctx, out, c, jc, dir)
		var perm *permanentError
		if err == nil || errors.As(err, &perm) || attempt >= downloadAttempts || ctx.Err() != nil {
			if perm != nil {
				return perm.err
			}
			return err
		}
		fmt.Fprintf(out, "WARNING: %v; downloading again (attempt %d of %d)\n", err, attempt+1, downloadAttempts)
		t := time.NewTimer(time.Duration(attempt) * time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// permanentError is a failure another download cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }

func artifactsDownload(ctx context.Context, out io.Writer, c *network.Client, jc network.JobCredentials, dir string) error {
	rc, err := c.DownloadArtifact(ctx, jc)
	if errors.Is(err, network.ErrNotFound) {
		return &permanentError{fmt.Errorf("downloading artifacts of job %d: not found: %w", jc.ID, err)}
	}
	if err != nil {
		// The client retried what could be retried.
		return &permanentError{fmt.Errorf("downloading artifacts of job %d: %w", jc.ID, err)}
	}
	defer rc.Close()
	tmp := &spool{}
	defer tmp.Close()
	size, err := io.Copy(tmp, rc)
	if err != nil {
		return fmt.Errorf("downloading artifacts of job %d: %w", jc.ID, err)
	}
	n, err := ExtractZipFrom(tmp.ReaderAt(), size, dir)
	if err != nil {
		return fmt.Errorf("extracting artifacts of job %d: %w", jc.ID, err)
	}
	fmt.Fprintf(out, "Downloaded and extracted artifacts of job %d (%d bytes, %d entries)\n", jc.ID, size, n)
	return nil
}
