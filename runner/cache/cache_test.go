package cache

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/helper"
)

func TestObjectName(t *testing.T) {
	const tok = "glrt-t1_AbCdEfGhIjKlMnOp"
	for _, tc := range []struct {
		path, key string
		shared    bool
		want      string
		err       string
	}{
		{"", "deps-non_protected", false, "runner/t1_AbCdEf/project/7/deps-non_protected", ""},
		{"", "deps-non_protected", true, "project/7/deps-non_protected", ""},
		{"ci/cache", "deps", false, "ci/cache/runner/t1_AbCdEf/project/7/deps", ""},
		// As GitLab: a Path with a leading slash makes object names with
		// one (path.Join keeps it), so both runners find the same objects.
		{"/ci/cache/", "deps", true, "/ci/cache/project/7/deps", ""},
		{"", "feature/x-non_protected", true, "project/7/feature/x-non_protected", ""},
		{"", "a/../b", true, "project/7/b", ""},
		{"", "../other-project", true, "", "leaves the project's cache"},
		{"", "a/../..", true, "", "leaves the project's cache"},
		{"", ".", true, "", "leaves the project's cache"},
		{"", "", true, "", "empty cache key"},
		{"", "bad\xffutf8", true, "", "S3 refuses"},
	} {
		got, err := ObjectName(&config.Cache{Path: tc.path, Shared: tc.shared}, tok, 7, tc.key)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q shared=%v: %q, %v; want error %q", tc.key, tc.shared, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q shared=%v path=%q: %q, %v; want %q", tc.key, tc.shared, tc.path, got, err, tc.want)
		}
	}
}

func TestShortTokenIsGitLabs(t *testing.T) {
	for tok, want := range map[string]string{
		"glrt-t1_AbCdEfGhIjKl":        "t1_AbCdEf",
		"glrt-abcdefghijklmnop":       "abcdefghi",
		"glrt-abc":                    "abc",
		"glrtr-abcdefghijklmnop":      "abcdefghi",
		"glcbt-abcdefghijklmnop":      "abcdefghi",
		"GR1348941abcdefghijklmnopqr": "GR1348941abcdefgh",
		"GRzzzzzzzabcdefghijklmnopqr": "GRzzzzzz",
		"0123456789abcdef":            "01234567",
		"short":                       "short",
	} {
		if got := ShortToken(tok); got != want {
			t.Errorf("ShortToken(%q) = %q, want %q", tok, got, want)
		}
	}
}

func TestClampExpiry(t *testing.T) {
	if clampExpiry(time.Second) != MinExpiry || clampExpiry(30*24*time.Hour) != MaxExpiry || clampExpiry(time.Hour) != time.Hour {
		t.Error("expiry not bounded to [MinExpiry, MaxExpiry]")
	}
}

// Against a real S3 server: the manager signs, the helper (with nothing
// but the URLs) uploads and downloads, and the object is where GitLab
// Runner would put it.
func TestPresignedURLsAgainstARealServer(t *testing.T) {
	endpoint, access, secret, bucket := testenv.S3(t)
	ctx := context.Background()
	for _, region := range []string{"us-east-1", ""} { // "": asked of the server
		t.Run("region="+region, func(t *testing.T) {
			c := &config.Cache{Type: "s3", Path: "runners", S3: &config.CacheS3{
				ServerAddress: endpoint, AccessKey: access, SecretKey: secret, BucketName: bucket, BucketLocation: region, Insecure: true,
			}}
			s, err := NewS3(c)
			if err != nil {
				t.Fatal(err)
			}
			object, err := s.ObjectName("glrt-abcdefghijklmnop", 42, "deps-"+region+"non_protected")
			if err != nil {
				t.Fatal(err)
			}
			put, err := s.UploadURL(ctx, object, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			get, err := s.DownloadURL(ctx, object, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if Signature(put) == "" || Signature(get) == "" || strings.Contains(put.String()+get.String(), secret) {
				t.Fatalf("URLs: %s %s", put.Redacted(), get.Redacted())
			}
			var out bytes.Buffer
			// Before the upload: no cache.
			if err := (helper.RemoteCache{}).Extract(ctx, &out, []string{get.String()}, []string{"deps"}, t.TempDir()); err != nil || !strings.Contains(out.String(), "Cache not found") {
				t.Fatalf("before the upload: %v\n%s", err, out.String())
			}
			src := t.TempDir()
			os.MkdirAll(filepath.Join(src, "vendor"), 0o755)
			os.WriteFile(filepath.Join(src, "vendor", "dep.txt"), []byte("dependency"), 0o644)
			if err := (helper.RemoteCache{}).Archive(ctx, &out, put.String(), "deps", src, helper.Selection{Paths: []string{"vendor/"}}, 0); err != nil {
				t.Fatalf("upload: %v\n%s", err, out.String())
			}
			raw, _ := minio.New(endpoint, &minio.Options{Creds: credentials.NewStaticV4(access, secret, ""), Region: "us-east-1"})
			want := "runners/runner/abcdefghi/project/42/deps-" + region + "non_protected"
			if _, err := raw.StatObject(ctx, bucket, want, minio.StatObjectOptions{}); err != nil {
				t.Fatalf("object %s: %v", want, err)
			}
			dst := t.TempDir()
			if err := (helper.RemoteCache{}).Extract(ctx, &out, []string{get.String()}, []string{"deps"}, dst); err != nil {
				t.Fatalf("download: %v\n%s", err, out.String())
			}
			if b, _ := os.ReadFile(filepath.Join(dst, "vendor", "dep.txt")); string(b) != "dependency" {
				t.Fatalf("extracted %q\n%s", b, out.String())
			}
			// A URL is for its method only.
			req, _ := http.NewRequest(http.MethodDelete, get.String(), nil)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
				if resp.StatusCode/100 == 2 {
					t.Error("a pre-signed GET deleted the object")
				}
			}
		})
	}
	t.Run("wrong secret", func(t *testing.T) {
		s, err := NewS3(&config.Cache{Type: "s3", S3: &config.CacheS3{ServerAddress: endpoint, AccessKey: access, SecretKey: "wrong-secret-value", BucketName: bucket, BucketLocation: "us-east-1", Insecure: true}})
		if err != nil {
			t.Fatal(err)
		}
		put, err := s.UploadURL(ctx, "x", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		src := t.TempDir()
		os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644)
		var out bytes.Buffer
		err = (helper.RemoteCache{}).Archive(ctx, &out, put.String(), "x", src, helper.Selection{Paths: []string{"f"}}, 0)
		if err == nil || !strings.Contains(err.Error(), "403") || strings.Contains(err.Error(), Signature(put)) {
			t.Fatalf("upload with a URL signed by a wrong secret: %v", err)
		}
	})
}
