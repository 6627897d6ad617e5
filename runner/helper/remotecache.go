package helper

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// CacheURLsEnv is the environment variable through which a job script
// hands the helper the pre-signed URLs of a distributed cache, one a line
// (never the command line, which other users can read: a URL is a
// credential for its object until it expires).
const CacheURLsEnv = "BERTH_CACHE_URLS"

// RemoteCache is what the cache commands need to reach an object store.
type RemoteCache struct {
	// Client sends the requests (nil: a client of its own).
	Client *http.Client
}

func (rc RemoteCache) client() *http.Client {
	if rc.Client != nil {
		return rc.Client
	}
	return http.DefaultClient
}

// errNoObject is a GET answered 404: no cache under that key yet.
var errNoObject = errors.New("no such object")

// Extract downloads the first cache archive of urls that exists and
// extracts it into dir. keys name the URLs in the log (same order; may be
// shorter). No archive under any URL is not an error ("Cache not found");
// a URL that fails otherwise is reported as a warning and the next one
// tried; the command fails only when no archive was extracted.
func (rc RemoteCache) Extract(ctx context.Context, out io.Writer, urls, keys []string, dir string) error {
	failed := 0
	for i, u := range urls {
		name := fmt.Sprintf("#%d", i+1)
		if i < len(keys) {
			name = keys[i]
		}
		n, size, err := rc.extract(ctx, u, dir)
		if errors.Is(err, errNoObject) {
			fmt.Fprintf(out, "No cache found for %s\n", name)
			continue
		}
		if err != nil {
			fmt.Fprintf(out, "WARNING: cache %s: %v\n", name, err)
			failed++
			continue
		}
		if i > 0 {
			fmt.Fprintf(out, "Using fallback cache %s\n", name)
		}
		fmt.Fprintf(out, "Downloaded and extracted cache %s (%d bytes, %d entries)\n", name, size, n)
		return nil
	}
	if failed > 0 {
		return fmt.Errorf("no cache extracted: %d of %d downloads failed", failed, len(urls))
	}
	fmt.Fprintln(out, "WARNING: Cache not found; continuing without it")
	return nil
}

func (rc RemoteCache) extract(ctx context.Context, rawURL, dir string) (entries int, size int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("cache URL %s: %w", redactURL(rawURL), unwrapURLError(err))
	}
	resp, err := rc.client().Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("GET %s: %w", redactURL(rawURL), unwrapURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return 0, 0, errNoObject
	}
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("GET %s: %s", redactURL(rawURL), s3Status(resp))
	}
	tmp := &spool{}
	defer tmp.Close()
	size, err = io.Copy(tmp, resp.Body)
	if err != nil {
		return 0, 0, fmt.Errorf("GET %s: %w", redactURL(rawURL), unwrapURLError(err))
	}
	if resp.ContentLength >= 0 && size != resp.ContentLength {
		return 0, 0, fmt.Errorf("GET %s: %d of %d bytes", redactURL(rawURL), size, resp.ContentLength)
	}
	n, err := ExtractZipFrom(tmp.ReaderAt(), size, dir)
	if err != nil {
		return 0, 0, fmt.Errorf("extracting: %w", err)
	}
	return n, size, nil
}

// Archive zips the selection of dir and uploads it to a pre-signed PUT
// URL, unless it is larger than max bytes (max > 0), which is reported
// and not uploaded. A selection without files uploads nothing.
func (rc RemoteCache) Archive(ctx context.Context, out io.Writer, rawURL, key, dir string, sel Selection, max int64) error {
	files, err := Files(dir, sel)
	if err != nil {
		return fmt.Errorf("selecting cache files: %w", err)
	}
	if len(files) == 0 {
		fmt.Fprintln(out, "WARNING: no matching files for the cache; nothing archived")
		return nil
	}
	tmp := &spool{}
	defer tmp.Close()
	n, err := CreateZip(tmp, dir, files)
	if err != nil {
		return fmt.Errorf("creating cache archive: %w", err)
	}
	if max > 0 && tmp.Size() > max {
		return fmt.Errorf("cache archive is %d bytes, over MaxUploadedArchiveSize (%d); not uploaded", tmp.Size(), max)
	}
	body, err := tmp.Open()
	if err != nil {
		return err
	}
	defer body.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, rawURL, body)
	if err != nil {
		return fmt.Errorf("cache URL %s: %w", redactURL(rawURL), unwrapURLError(err))
	}
	// A pre-signed PUT takes no chunked body: the length goes first.
	req.ContentLength = tmp.Size()
	req.GetBody = tmp.Open
	req.Header.Set("Content-Type", "application/zip")
	resp, err := rc.client().Do(req)
	if err != nil {
		return fmt.Errorf("PUT %s: %w", redactURL(rawURL), unwrapURLError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("PUT %s: %s", redactURL(rawURL), s3Status(resp))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	fmt.Fprintf(out, "Uploaded cache %s (%d bytes, %d entries)\n", key, tmp.Size(), n)
	return nil
}

// redactURL is a URL without its query (a pre-signed URL's signature and
// credential scope) and user information: what may go to the log.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// unwrapURLError drops the URL net/http puts in its errors: it would
// carry the signature into the log.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// s3Status describes a refused request: status, and S3's error code
// when the body is an S3 error document.
func s3Status(resp *http.Response) string {
	var doc struct {
		Code    string `xml:"Code"`
		Message string `xml:"Message"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if xml.Unmarshal(b, &doc) == nil && doc.Code != "" {
		msg := strings.TrimSpace(doc.Message)
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
		return fmt.Sprintf("%s (%s: %s)", resp.Status, doc.Code, msg)
	}
	return resp.Status
}
