// Package cache is the runner manager's side of GitLab Runner's
// distributed cache ([runners.cache] with Type = "s3"): where a job's
// cache archive lives in the bucket, and the pre-signed URLs through which
// the job's environment downloads and uploads it. The manager holds the
// credentials and only ever hands out URLs, each good for one object, one
// method and a bounded time; the archive's bytes go between the job's
// environment and the object store, never through the manager or the
// coordinator.
package cache

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"

	"github.com/berthci/berth/runner/config"
)

// MaxExpiry is the longest validity of a SigV4 pre-signed URL.
const MaxExpiry = 7 * 24 * time.Hour

// MinExpiry is the shortest validity Berth gives a URL.
const MinExpiry = 5 * time.Minute

// S3 signs URLs of one runner's cache objects in an S3-compatible bucket.
// It is safe for concurrent use.
type S3 struct {
	cfg    config.Cache
	s3     config.CacheS3
	client *minio.Client
}

// NewS3 returns the cache of a validated [runners.cache] whose Type is
// s3. It does no I/O: the bucket's region, when BucketLocation is empty,
// is asked of the server at the first URL and remembered.
func NewS3(c *config.Cache) (*S3, error) {
	if c == nil || c.RemoteType() != config.CacheTypeS3 || c.S3 == nil {
		return nil, errors.New("cache: not an s3 cache")
	}
	s := c.S3
	opts := &minio.Options{
		Creds:      credentials.NewStaticV4(s.AccessKey, s.SecretKey, s.SessionToken),
		Secure:     !s.Insecure,
		Region:     s.BucketLocation,
		MaxRetries: 3,
	}
	if s.PathStyle != nil {
		opts.BucketLookup = minio.BucketLookupDNS
		if *s.PathStyle {
			opts.BucketLookup = minio.BucketLookupPath
		}
	}
	client, err := minio.New(s.Endpoint(), opts)
	if err != nil {
		return nil, fmt.Errorf("cache: s3 client for %s: %w", s.Endpoint(), err)
	}
	return &S3{cfg: *c, s3: *s, client: client}, nil
}

// Secrets are the values the job log must never show: the secret key
// and the session token.
func (s *S3) Secrets() []string { return []string{s.s3.SecretKey, s.s3.SessionToken} }

// MaxUploadSize is MaxUploadedArchiveSize (0: no limit).
func (s *S3) MaxUploadSize() int64 { return s.cfg.MaxUploadedArchiveSize }

// ObjectName is the object of a cache key, as GitLab Runner names it:
//
//	<Path>/runner/<short token>/project/<project id>/<key>   (not Shared)
//	<Path>/project/<project id>/<key>                        (Shared)
//
// so that a runner moved from GitLab Runner to Berth with the same
// bucket, Path and token finds its caches. A key that would leave its
// project's directory ("../x") is refused.
func (s *S3) ObjectName(runnerToken string, projectID int64, key string) (string, error) {
	return ObjectName(&s.cfg, runnerToken, projectID, key)
}

// ObjectName is S3.ObjectName for a configuration.
func ObjectName(c *config.Cache, runnerToken string, projectID int64, key string) (string, error) {
	if key == "" {
		return "", errors.New("empty cache key")
	}
	namespace := ""
	if !c.Shared {
		namespace = path.Join("runner", ShortToken(runnerToken))
	}
	base := path.Join(c.Path, namespace, "project", strconv.FormatInt(projectID, 10))
	name := path.Join(base, key)
	if !strings.HasPrefix(name, base+"/") {
		return "", fmt.Errorf("cache key %q leaves the project's cache (remove ../ from the key)", key)
	}
	// S3 object names are at most 1024 bytes of UTF-8.
	if err := s3utils.CheckValidObjectName(name); err != nil || len(name) > 1024 {
		return "", fmt.Errorf("cache key %q makes an object name S3 refuses", key)
	}
	return name, nil
}

// ShortToken is GitLab Runner's short form of a runner token, which it
// uses in object names: the 9 characters after a glrt-, glrtr- or glcbt-
// prefix, 17 characters of a GR… rotation-date token, else the first 8.
// (Berth's logs use token.Short, which differs for some tokens; object
// names must be GitLab's.)
func ShortToken(t string) string {
	switch {
	case len(t) < 8:
		return t
	case strings.HasPrefix(t, "glrt-"):
		return shortAfter(t, 5)
	case strings.HasPrefix(t, "glrtr-"), strings.HasPrefix(t, "glcbt-"):
		return shortAfter(t, 6)
	case strings.HasPrefix(t, "GR") && len(t) >= 17 && isHex(t[2:9]):
		return t[:17]
	}
	return t[:8]
}

func shortAfter(t string, prefix int) string {
	end := prefix + 9
	if end > len(t) {
		end = len(t)
	}
	return t[prefix:end]
}

func isHex(s string) bool {
	for _, r := range s {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f' || r >= 'A' && r <= 'F') {
			return false
		}
	}
	return true
}

// DownloadURL is a pre-signed GET of object, valid for expiry (bounded
// to [MinExpiry, MaxExpiry]).
func (s *S3) DownloadURL(ctx context.Context, object string, expiry time.Duration) (*url.URL, error) {
	u, err := s.client.PresignedGetObject(ctx, s.s3.BucketName, object, clampExpiry(expiry), nil)
	if err != nil {
		return nil, fmt.Errorf("signing the download URL of %s: %w", object, err)
	}
	return u, nil
}

// UploadURL is a pre-signed PUT of object, valid for expiry (bounded to
// [MinExpiry, MaxExpiry]). The uploader must send Content-Length: S3
// takes no chunked body on a pre-signed PUT.
func (s *S3) UploadURL(ctx context.Context, object string, expiry time.Duration) (*url.URL, error) {
	u, err := s.client.PresignedPutObject(ctx, s.s3.BucketName, object, clampExpiry(expiry))
	if err != nil {
		return nil, fmt.Errorf("signing the upload URL of %s: %w", object, err)
	}
	return u, nil
}

func clampExpiry(d time.Duration) time.Duration {
	switch {
	case d < MinExpiry:
		return MinExpiry
	case d > MaxExpiry:
		return MaxExpiry
	}
	return d
}

// Signature is the X-Amz-Signature of a pre-signed URL: what makes it
// usable, and so what the job log masks.
func Signature(u *url.URL) string {
	return u.Query().Get("X-Amz-Signature")
}
