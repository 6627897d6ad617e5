package embedded

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/runnerapi"
)

func TestOpenServeShutdownReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(ctx, Options{DataDir: dir, Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	if c.URL != "http://"+ln.Addr().String() {
		t.Fatalf("URL %q", c.URL)
	}
	resp, err := http.Get(c.URL + "/-/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "GitLab OK" {
		t.Fatalf("health: %d %q", resp.StatusCode, b)
	}
	spec := dispatch.JobSpec{Name: "kept", ProjectID: 1, Steps: []runnerapi.Step{{Name: "script", Script: []string{"true"}}}}
	if _, err := c.Enqueue(ctx, spec); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"berth.db", "artifacts"} {
		if _, err := os.Stat(filepath.Join(dir, sub)); err != nil {
			t.Errorf("%s not created: %v", sub, err)
		}
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(c.URL + "/-/health"); err == nil {
		t.Fatal("still serving after Shutdown")
	}

	c2, err := Open(ctx, Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Shutdown(ctx)
	if c2.Queue().Len() != 1 {
		t.Fatalf("reopened coordinator has %d queued jobs, want 1", c2.Queue().Len())
	}
}

func TestOpenWithoutDataDirFails(t *testing.T) {
	if _, err := Open(context.Background(), Options{}); err == nil {
		t.Fatal("Open without a data directory succeeded")
	}
}

// TestOpenRestrictsAnOlderDataDirectory: a data directory an earlier
// version made readable by everyone is restricted at open.
func TestOpenRestrictsAnOlderDataDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "berth.db"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Open(context.Background(), Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown(context.Background())
	for path, want := range map[string]os.FileMode{dir: 0o700, filepath.Join(dir, "berth.db"): 0o600} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want mode %v", path, fi, err, want)
		}
	}
}
