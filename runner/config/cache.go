package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/minio/minio-go/v7/pkg/s3utils"
)

// Cache is [runners.cache], GitLab Runner's distributed cache: with
// Type = "s3" every job's cache archive is an object of an S3-compatible
// bucket, which the job's environment downloads and uploads itself
// through pre-signed URLs the runner manager computes (runner/cache).
// Without a Type the local cache_dir is used, as before.
type Cache struct {
	// Type is "s3", or "" for the local cache. GitLab's other types (gcs,
	// azure) load with a warning and leave the local cache in use.
	Type string `toml:"Type"`
	// Path is prepended to every object name.
	Path string `toml:"Path"`
	// Shared lets every runner with this bucket and Path use the same
	// objects; else each runner has its own namespace (runner/<short
	// token>).
	Shared bool `toml:"Shared"`
	// MaxUploadedArchiveSize refuses to upload a cache archive larger
	// than this many bytes (0: no limit). The job's helper enforces it.
	MaxUploadedArchiveSize int64 `toml:"MaxUploadedArchiveSize"`

	S3 *CacheS3 `toml:"s3"`
}

// CacheS3 is [runners.cache.s3].
type CacheS3 struct {
	// ServerAddress is host[:port] of the S3 API (default: AWS S3).
	ServerAddress string `toml:"ServerAddress"`
	AccessKey     string `toml:"AccessKey"`
	SecretKey     string `toml:"SecretKey"`
	SessionToken  string `toml:"SessionToken"`
	BucketName    string `toml:"BucketName"`
	// BucketLocation is the bucket's region ("": asked of the server
	// once).
	BucketLocation string `toml:"BucketLocation"`
	// Insecure talks plain HTTP to ServerAddress instead of HTTPS.
	Insecure bool `toml:"Insecure"`
	// AuthenticationType is access-key (Berth supports only it) or iam.
	AuthenticationType string `toml:"AuthenticationType"`
	// PathStyle forces path-style (true) or virtual-host (false)
	// requests; unset chooses by ServerAddress, as GitLab does.
	PathStyle *bool `toml:"PathStyle"`

	// Decoded to be refused: objects would be stored without the
	// encryption the file asks for.
	ServerSideEncryption      string `toml:"ServerSideEncryption"`
	ServerSideEncryptionKeyID string `toml:"ServerSideEncryptionKeyID"`
}

// CacheTypeS3 is the Type of the S3 cache.
const CacheTypeS3 = "s3"

// RemoteType is the distributed cache's type in use: "s3", or "" for
// the local cache (no section, no Type, or a Type Berth lacks).
func (c *Cache) RemoteType() string {
	if c == nil || !strings.EqualFold(c.Type, CacheTypeS3) {
		return ""
	}
	return CacheTypeS3
}

// Endpoint is ServerAddress, or AWS S3's endpoint when empty.
func (s *CacheS3) Endpoint() string {
	if s.ServerAddress == "" {
		return "s3.amazonaws.com"
	}
	return s.ServerAddress
}

// validateCache checks [runners.cache] of a runner whose Type is s3.
func validateCache(c *Cache, bad func(key, format string, args ...any), k func(string) string) {
	if c == nil {
		return
	}
	if c.MaxUploadedArchiveSize < 0 {
		bad(k("cache.MaxUploadedArchiveSize"), "must not be negative")
	}
	if c.RemoteType() != CacheTypeS3 {
		return
	}
	s := c.S3
	if s == nil {
		bad(k("cache.s3"), `is required for Type = "s3" ([runners.cache.s3] with BucketName, AccessKey, SecretKey)`)
		return
	}
	if s.BucketName == "" {
		bad(k("cache.s3.BucketName"), "is required")
	} else if err := s3utils.CheckValidBucketName(s.BucketName); err != nil {
		bad(k("cache.s3.BucketName"), "%q: %v", s.BucketName, err)
	}
	if a := s.ServerAddress; a != "" {
		if strings.Contains(a, "://") {
			bad(k("cache.s3.ServerAddress"), "want host[:port] without a scheme (Insecure = true for plain HTTP), got %q", a)
		} else if host, port, err := net.SplitHostPort(a); err == nil {
			if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 || host == "" {
				bad(k("cache.s3.ServerAddress"), "want host[:port], got %q", a)
			}
		} else if strings.ContainsAny(a, "/?#@ ") || strings.Count(a, ":") == 1 {
			bad(k("cache.s3.ServerAddress"), "want host[:port], got %q", a)
		}
	}
	switch strings.ToLower(s.AuthenticationType) {
	case "access-key":
		if s.AccessKey == "" || s.SecretKey == "" {
			bad(k("cache.s3"), `AuthenticationType = "access-key" needs AccessKey and SecretKey`)
		}
	case "":
		if s.AccessKey == "" || s.SecretKey == "" {
			bad(k("cache.s3"), "AccessKey and SecretKey are required: without them GitLab Runner uses IAM credentials (instance profile), which Berth does not support yet")
		}
	case "iam":
		bad(k("cache.s3.AuthenticationType"), `"iam" (instance profile credentials) is not supported by Berth yet; use "access-key" with AccessKey and SecretKey`)
	default:
		bad(k("cache.s3.AuthenticationType"), "must be access-key or iam, not %q", s.AuthenticationType)
	}
	if s.ServerSideEncryption != "" || s.ServerSideEncryptionKeyID != "" {
		bad(k("cache.s3.ServerSideEncryption"), "server-side encryption of cache objects is not supported by Berth yet (they would be stored unencrypted): remove the key, or turn on the bucket's default encryption")
	}
}

// cacheTypeWarning is the warning for a Type Berth does not support
// ("" when it is supported).
func cacheTypeWarning(c *Cache) string {
	if c == nil || c.Type == "" || c.RemoteType() != "" {
		return ""
	}
	return fmt.Sprintf("cache type %q is not supported by Berth yet (supported: s3); this runner uses the local cache_dir", c.Type)
}
