package artifacts_test

import (
	"context"
	"testing"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/artifacts/artifactstest"
	"github.com/berthci/berth/internal/testenv"
)

func TestDirConformance(t *testing.T) {
	artifactstest.Run(t, func(t *testing.T) artifacts.Storage {
		d, err := artifacts.NewDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}

// TestS3Conformance runs the suite against a real S3 server
// (BERTH_S3_SERVER_BINARY), one bucket per subtest, keys under a prefix.
func TestS3Conformance(t *testing.T) {
	testenv.S3Server(t) // skip or fail before the subtests when there is no server
	artifactstest.Run(t, func(t *testing.T) artifacts.Storage {
		return openTestS3(t, "artifacts/test")
	})
}

// openTestS3 starts a server and opens a store on a fresh bucket of it.
func openTestS3(t testing.TB, prefix string) *artifacts.S3 {
	t.Helper()
	endpoint, access, secret, bucket := testenv.S3(t)
	env := map[string]string{"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}
	u := "s3://" + bucket + "/" + prefix + "?endpoint=" + endpoint + "&region=us-east-1&insecure=true"
	s, err := artifacts.OpenS3(context.Background(), u, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	return s
}
