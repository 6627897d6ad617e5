package network

import (
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"time"

	"github.com/berthci/berth/runnerapi"
)

// ArtifactOptions are the query parameters of an artifact upload; empty
// ones are left out (the server defaults to archive/zip).
type ArtifactOptions struct {
	Name     string // file name of the part; default "artifacts.zip"
	Type     string // artifact_type
	Format   string // artifact_format
	ExpireIn string // expire_in
}

// UploadArtifact streams an archive to POST /jobs/:id/artifacts as the
// single multipart part "file". open is called once per attempt (the body
// is streamed, so a retry needs it again). 307 is followed to its
// Location; 408/429/5xx are retried like every call.
func (c *Client) UploadArtifact(ctx context.Context, jc JobCredentials, open func() (io.ReadCloser, error), opts ArtifactOptions) error {
	op := "POST " + jc.path("/artifacts")
	q := url.Values{}
	if opts.Type != "" {
		q.Set("artifact_type", opts.Type)
	}
	if opts.Format != "" {
		q.Set("artifact_format", opts.Format)
	}
	if opts.ExpireIn != "" {
		q.Set("expire_in", opts.ExpireIn)
	}
	target := BaseURL(jc.URL) + jc.path("/artifacts")
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	name := opts.Name
	if name == "" {
		name = "artifacts.zip"
	}
	for attempt := 0; ; attempt++ {
		code, hdr, msg, err := c.uploadOnce(ctx, c.clientFor(jc.URL, false), target, jc.Token, name, open)
		if err == nil {
			switch {
			case code == http.StatusCreated || code == http.StatusOK:
				return nil
			case code == http.StatusTemporaryRedirect && hdr.Get("Location") != "":
				loc, perr := url.Parse(hdr.Get("Location"))
				if perr != nil {
					return fmt.Errorf("%s: bad redirect: %w", op, perr)
				}
				base, _ := url.Parse(target)
				target = base.ResolveReference(loc).String()
			case !retryable(code):
				return &StatusError{Op: op, Code: code, Message: msg, JobStatus: hdr.Get(runnerapi.HeaderJobStatus)}
			}
		} else if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", op, ctx.Err())
		}
		if attempt+1 >= c.maxAttempts {
			if err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
			return &StatusError{Op: op, Code: code, Message: msg}
		}
		wait := c.backoff.Delay(attempt)
		if err == nil && code == http.StatusTemporaryRedirect {
			wait = 0
		} else if err == nil {
			wait = c.retryWait(hdr, attempt)
		}
		if err := sleepCtx(ctx, wait); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
}

func (c *Client) uploadOnce(ctx context.Context, hc *http.Client, target, jobToken, name string, open func() (io.ReadCloser, error)) (int, http.Header, string, error) {
	src, err := open()
	if err != nil {
		return 0, nil, "", err
	}
	defer src.Close()
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		part, err := mw.CreateFormFile("file", name)
		if err == nil {
			_, err = io.Copy(part, src)
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	req, err := http.NewRequestWithContext(ctx, "POST", target, pr)
	if err != nil {
		pr.Close()
		return 0, nil, "", err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("User-Agent", c.userAgent)
	req.Header.Set(runnerapi.HeaderRequestID, newRequestID())
	req.Header.Set(runnerapi.HeaderJobToken, jobToken)
	resp, err := hc.Do(req)
	pr.Close()
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	r := &response{code: resp.StatusCode, header: resp.Header, body: b}
	msg := ""
	if resp.StatusCode >= 300 {
		if se, ok := statusError("", r).(*StatusError); ok {
			msg = se.Message
		}
	}
	return resp.StatusCode, resp.Header, msg, nil
}

// DownloadArtifact opens the archive of job jc.ID (GET /jobs/:id/artifacts)
// with jc.Token. Redirects (302/307 to object storage) are followed without
// the job token. Failed attempts before the body are retried like every
// call; the caller reads and closes the body.
func (c *Client) DownloadArtifact(ctx context.Context, jc JobCredentials) (io.ReadCloser, error) {
	return c.download(ctx, jc, "/artifacts")
}

// DownloadPipelineSnapshot opens the bundle of snapshot point point that
// job, an earlier job of jc's pipeline, took (Berth's GET
// /jobs/:id/berth_snapshots/:point?job=NAME, with jc's token). A
// *StatusError with Code 404 when there is none.
func (c *Client) DownloadPipelineSnapshot(ctx context.Context, jc JobCredentials, job, point string) (io.ReadCloser, error) {
	return c.download(ctx, jc, "/berth_snapshots/"+url.PathEscape(point)+"?job="+url.QueryEscape(job))
}

// download GETs jc's job path suffix with its token.
func (c *Client) download(ctx context.Context, jc JobCredentials, suffix string) (io.ReadCloser, error) {
	op := "GET " + jc.path(suffix)
	target := BaseURL(jc.URL) + jc.path(suffix)
	withToken := true
	redirects := 0
	for attempt := 0; ; {
		req, err := http.NewRequestWithContext(ctx, "GET", target, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		req.Header.Set("User-Agent", c.userAgent)
		req.Header.Set(runnerapi.HeaderRequestID, newRequestID())
		if withToken {
			req.Header.Set(runnerapi.HeaderJobToken, jc.Token)
		}
		resp, err := c.clientFor(jc.URL, false).Do(req)
		var wait time.Duration
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%s: %w", op, ctx.Err())
			}
			wait = c.backoff.Delay(attempt)
		} else {
			switch {
			case resp.StatusCode == http.StatusOK:
				return resp.Body, nil
			case (resp.StatusCode == http.StatusFound || resp.StatusCode == http.StatusTemporaryRedirect ||
				resp.StatusCode == http.StatusMovedPermanently || resp.StatusCode == http.StatusSeeOther) && resp.Header.Get("Location") != "":
				resp.Body.Close()
				redirects++
				if redirects > 10 {
					return nil, fmt.Errorf("%s: too many redirects", op)
				}
				loc, perr := resp.Request.URL.Parse(resp.Header.Get("Location"))
				if perr != nil {
					return nil, fmt.Errorf("%s: bad redirect: %w", op, perr)
				}
				target, withToken = loc.String(), false
				continue
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			r := &response{code: resp.StatusCode, header: resp.Header, body: b}
			if !retryable(resp.StatusCode) {
				return nil, statusError(op, r)
			}
			wait = c.retryWait(resp.Header, attempt)
			err = statusError(op, r)
		}
		attempt++
		if attempt >= c.maxAttempts {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if err := sleepCtx(ctx, wait); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
