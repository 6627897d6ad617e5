package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const s3CacheConfig = `concurrent = 1
[[runners]]
  url = "https://gitlab.example.com"
  token = "glrt-abc"
  executor = "shell"
  [runners.cache]
    Type = "s3"
    Path = "ci/cache"
    Shared = true
    MaxUploadedArchiveSize = 1048576
    [runners.cache.s3]
      ServerAddress = "minio.internal:9000"
      AccessKey = "AKIAEXAMPLE"
      SecretKey = "s3cr3t"
      SessionToken = "session"
      BucketName = "runner-cache"
      BucketLocation = "eu-west-1"
      Insecure = true
      AuthenticationType = "access-key"
      PathStyle = true
      DualStack = false
`

func TestS3CacheSection(t *testing.T) {
	c, warns, err := Parse("config.toml", []byte(s3CacheConfig))
	if err != nil {
		t.Fatal(err)
	}
	cc := c.Runners[0].Cache
	if cc.RemoteType() != "s3" || cc.Path != "ci/cache" || !cc.Shared || cc.MaxUploadedArchiveSize != 1<<20 || cc.S3 == nil {
		t.Fatalf("cache %+v", cc)
	}
	s := cc.S3
	if s.Endpoint() != "minio.internal:9000" || s.AccessKey != "AKIAEXAMPLE" || s.SecretKey != "s3cr3t" || s.SessionToken != "session" ||
		s.BucketName != "runner-cache" || s.BucketLocation != "eu-west-1" || !s.Insecure || s.PathStyle == nil || !*s.PathStyle {
		t.Fatalf("s3 %+v", s)
	}
	if len(warns) != 1 || warns[0].Key != "runners.cache.s3.DualStack" || warns[0].Line != 21 || !strings.Contains(warns[0].Msg, "not supported") {
		t.Errorf("warnings %v, want only DualStack's", warns)
	}
	// Save keeps the section as written.
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := Save(p, c); err != nil {
		t.Fatal(err)
	}
	again, _, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if a := again.Runners[0].Cache; a == nil || a.S3 == nil || a.S3.BucketName != "runner-cache" || !a.Shared {
		t.Fatalf("after Save: %+v", a)
	}
	b, _ := os.ReadFile(p)
	if !strings.Contains(string(b), "DualStack") {
		t.Errorf("Save dropped a key it does not know:\n%s", b)
	}
	if (&CacheS3{}).Endpoint() != "s3.amazonaws.com" {
		t.Error("no ServerAddress is AWS S3")
	}
}

func TestS3CacheErrors(t *testing.T) {
	head := "[[runners]]\n  url = \"http://x\"\n  token = \"t\"\n  executor = \"shell\"\n  [runners.cache]\n    Type = \"s3\"\n"
	s3 := "    [runners.cache.s3]\n      BucketName = \"b-1\"\n      AccessKey = \"AK\"\n      SecretKey = \"SK\"\n"
	for _, tc := range []struct {
		name, doc string
		want      []string
	}{
		{"no s3 section", head, []string{"cfg.toml:5:", "runners[0].cache.s3", "is required"}},
		{"no bucket", head + "    [runners.cache.s3]\n      AccessKey = \"AK\"\n      SecretKey = \"SK\"\n", []string{"cfg.toml:7:", "runners[0].cache.s3.BucketName", "is required"}},
		{"bad bucket", head + s3 + "      ServerAddress = \"h:9000\"\n" + "[[runners]]\n  url = \"http://x\"\n  token = \"t\"\n  executor = \"shell\"\n  [runners.cache]\n    Type = \"s3\"\n    [runners.cache.s3]\n      BucketName = \"b/c\"\n      AccessKey = \"AK\"\n      SecretKey = \"SK\"\n", []string{"cfg.toml:19:", "runners[1].cache.s3.BucketName", "b/c"}},
		{"scheme in address", head + s3 + "      ServerAddress = \"http://minio:9000\"\n", []string{"cfg.toml:11:", "ServerAddress", "without a scheme"}},
		{"bad port", head + s3 + "      ServerAddress = \"minio:http\"\n", []string{"ServerAddress", "want host[:port]"}},
		{"iam", head + s3 + "      AuthenticationType = \"iam\"\n", []string{"cfg.toml:11:", "runners[0].cache.s3.AuthenticationType", "not supported by Berth yet"}},
		{"implicit iam", head + "    [runners.cache.s3]\n      BucketName = \"b-1\"\n", []string{"cfg.toml:7:", "runners[0].cache.s3", "IAM"}},
		{"access-key without keys", head + "    [runners.cache.s3]\n      BucketName = \"b-1\"\n      AuthenticationType = \"access-key\"\n", []string{"needs AccessKey and SecretKey"}},
		{"unknown auth", head + s3 + "      AuthenticationType = \"magic\"\n", []string{"must be access-key or iam"}},
		{"encryption", head + s3 + "      ServerSideEncryption = \"KMS\"\n", []string{"cfg.toml:11:", "unencrypted"}},
		{"negative size", head + "    MaxUploadedArchiveSize = -1\n" + s3, []string{"cfg.toml:7:", "MaxUploadedArchiveSize", "negative"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Parse("cfg.toml", []byte(tc.doc))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "SK") {
				t.Errorf("the error holds the secret key: %v", err)
			}
		})
	}
}

func TestLocalCacheWithoutType(t *testing.T) {
	for _, doc := range []string{
		"[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"shell\"\n",
		"[[runners]]\n url = \"http://x\"\n token = \"t\"\n executor = \"shell\"\n [runners.cache]\n  MaxUploadedArchiveSize = 5\n",
	} {
		c, warns, err := Parse("c.toml", []byte(doc))
		if err != nil || len(warns) != 0 {
			t.Fatalf("%v %v", err, warns)
		}
		if c.Runners[0].Cache.RemoteType() != "" {
			t.Errorf("no Type: remote cache %q", c.Runners[0].Cache.RemoteType())
		}
	}
}
