package artifacts_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/internal/testenv"
)

// The object of a key is PREFIX/KEY, and a failed multipart Put leaves
// no incomplete upload behind (S3 would keep and bill its parts).
func TestS3LayoutAndNoIncompleteUploads(t *testing.T) {
	endpoint, access, secret, bucket := testenv.S3(t)
	env := map[string]string{"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}
	ctx := context.Background()
	s, err := artifacts.OpenS3(ctx, "s3://"+bucket+"/berth/artifacts?endpoint="+endpoint+"&insecure=true&region=us-east-1", func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	raw, err := minio.New(endpoint, &minio.Options{Creds: credentials.NewStaticV4(access, secret, ""), Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "7/archive.zip", strings.NewReader("zip bytes"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.StatObject(ctx, bucket, "berth/artifacts/7/archive.zip", minio.StatObjectOptions{}); err != nil {
		t.Fatalf("the object of key 7/archive.zip is not PREFIX/KEY: %v", err)
	}
	big := make([]byte, 20<<20)
	rand.Read(big)
	if _, err := s.Put(ctx, "7/big", bytes.NewReader(big), 17<<20); !errors.Is(err, artifacts.ErrTooLarge) {
		t.Fatalf("oversized multipart Put: %v", err)
	}
	boom := errors.New("boom")
	if _, err := s.Put(ctx, "7/broken", io.MultiReader(bytes.NewReader(big), iotestErr{boom}), 0); !errors.Is(err, boom) {
		t.Fatalf("failing multipart Put: %v", err)
	}
	for u := range raw.ListIncompleteUploads(ctx, bucket, "", true) {
		if u.Err != nil {
			t.Fatalf("listing incomplete uploads: %v", u.Err)
		}
		t.Errorf("incomplete upload left behind: %s (%s)", u.Key, u.UploadID)
	}
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

// Opening checks the bucket and the credentials at once, and no error
// ever holds the secret key.
func TestOpenS3Errors(t *testing.T) {
	endpoint, access, secret, bucket := testenv.S3(t)
	ctx := context.Background()
	base := "?endpoint=" + endpoint + "&insecure=true&region=us-east-1"
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	good := env(map[string]string{"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret})
	const wrongSecret = "wrong-secret-7f3a9c"
	credFile := filepath.Join(t.TempDir(), "credentials")
	os.WriteFile(credFile, []byte("[ci]\naws_access_key_id = "+access+"\naws_secret_access_key = "+secret+"\n"), 0o600)
	for _, tc := range []struct {
		name, url string
		getenv    func(string) string
		want      string // "" = opens
	}{
		{"good", "s3://" + bucket + base, good, ""},
		{"credentials file", "s3://" + bucket + base + "&credentials_file=" + credFile + "&profile=ci", nil, ""},
		{"missing bucket", "s3://no-such-bucket-here" + base, good, `bucket "no-such-bucket-here" does not exist`},
		{"wrong secret", "s3://" + bucket + base, env(map[string]string{"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": wrongSecret}), "checking the bucket"},
		{"no credentials", "s3://" + bucket + base, env(nil), "no credentials"},
		{"missing credentials file", "s3://" + bucket + base + "&credentials_file=/nonexistent/creds", nil, "reading credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := artifacts.OpenS3(ctx, tc.url, tc.getenv)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.Put(ctx, "k", strings.NewReader("x"), 0); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("OpenS3: %v, want an error containing %q", err, tc.want)
			}
			for _, s := range []string{secret, wrongSecret} {
				if strings.Contains(err.Error(), s) {
					t.Fatalf("the error holds a secret key: %v", err)
				}
			}
		})
	}
}
