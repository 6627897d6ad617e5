package coordinator

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/internal/testenv"
)

// Git LFS on the coordinator's git hosting, with the real git-lfs client:
// a developer's push uploads the objects, a reporter's push is refused at
// its upload, a reporter clones and pulls them, and the transfers check
// what they are given.
func TestGitLFSHosting(t *testing.T) {
	e := newGitEnv(t, Config{})
	testenv.LookPath(t, "git-lfs")
	proj := e.createProject(t, "g/lfs")
	p := &store.Project{ID: proj.ID, Path: "g/lfs"}
	dev, rep := e.newUser("dev", "read-only"), e.newUser("rep", "read-only")
	e.addMember(p, "dev", store.AccessDeveloper)
	e.addMember(p, "rep", store.AccessReporter)
	remote := func(user, tok string) string {
		u, _ := url.Parse(e.http.URL + "/g/lfs.git")
		u.User = url.UserPassword(user, tok)
		return u.String()
	}

	work := t.TempDir()
	testenv.Git(t, work, nil, "init", "-q", "-b", "main")
	testenv.Git(t, work, nil, "lfs", "install", "--local")
	testenv.Git(t, work, nil, "lfs", "track", "*.bin")
	content := []byte(strings.Repeat("large binary content\n", 1000))
	if err := os.WriteFile(filepath.Join(work, "big.bin"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Git(t, work, nil, "add", "-A")
	testenv.Git(t, work, nil, "commit", "-q", "-m", "lfs")
	sum := sha256.Sum256(content)
	oid := hex.EncodeToString(sum[:])
	stored := filepath.Join(e.srv.git.RepoPath(proj.ID), "lfs", "objects", oid[:2], oid[2:4], oid)

	if out, err := testenv.GitOutput(work, nil, "push", "-o", "ci.skip", remote("rep", rep), "main:feature"); err == nil {
		t.Fatalf("a reporter's push went through:\n%s", out)
	} else if !strings.Contains(err.Error(), "403") && !strings.Contains(err.Error(), "developer") {
		t.Errorf("a reporter's push failed for another reason: %v", err)
	}
	if _, err := os.Stat(stored); err == nil {
		t.Fatal("a reporter's upload was kept")
	}
	testenv.Git(t, work, nil, "push", "-q", "-o", "ci.skip", remote("dev", dev), "main:feature") // (main is protected: maintainers push there)
	if b, err := os.ReadFile(stored); err != nil || !bytes.Equal(b, content) {
		t.Fatalf("the pushed object is not stored as it was given: %v", err)
	}

	clone := filepath.Join(t.TempDir(), "clone")
	testenv.Git(t, filepath.Dir(clone), []string{"GIT_LFS_SKIP_SMUDGE=1"}, "clone", "-q", "-b", "feature", remote("rep", rep), clone)
	if b, _ := os.ReadFile(filepath.Join(clone, "big.bin")); !bytes.HasPrefix(b, []byte("version https://git-lfs")) {
		t.Fatalf("the clone's big.bin is not a pointer: %.80q", b)
	}
	testenv.Git(t, clone, nil, "lfs", "install", "--local")
	testenv.Git(t, clone, nil, "lfs", "pull")
	if b, _ := os.ReadFile(filepath.Join(clone, "big.bin")); !bytes.Equal(b, content) {
		t.Fatalf("git lfs pull did not bring the object: %.80q", b)
	}

	// The transfers themselves.
	obj := e.http.URL + "/g/lfs.git/gitlab-lfs/objects/"
	do := func(method, path, user, tok string, body []byte) int {
		t.Helper()
		req, _ := http.NewRequest(method, path, bytes.NewReader(body))
		if user != "" {
			req.SetBasicAuth(user, tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	other := []byte("other content")
	osum := sha256.Sum256(other)
	ooid := hex.EncodeToString(osum[:])
	for _, tt := range []struct {
		name, method, path, user, tok string
		body                          []byte
		want                          int
	}{
		{"download", "GET", obj + oid, "rep", rep, nil, http.StatusOK},
		{"download without credentials", "GET", obj + oid, "", "", nil, http.StatusUnauthorized},
		{"download by a stranger", "GET", obj + oid, "x", "not-a-token", nil, http.StatusNotFound},
		{"a missing object", "GET", obj + ooid, "rep", rep, nil, http.StatusNotFound},
		{"upload by a reporter", "PUT", obj + ooid + fmt.Sprintf("/%d", len(other)), "rep", rep, other, http.StatusForbidden},
		{"upload of other content", "PUT", obj + oid + fmt.Sprintf("/%d", len(other)), "dev", dev, other, http.StatusBadRequest},
		{"upload of a wrong size", "PUT", obj + ooid + "/5", "dev", dev, other, http.StatusBadRequest},
		{"upload of fewer bytes than its size", "PUT", obj + ooid + "/20", "dev", dev, other, http.StatusBadRequest},
		{"upload", "PUT", obj + ooid + fmt.Sprintf("/%d", len(other)), "dev", dev, other, http.StatusOK},
		{"another project's path", "GET", e.http.URL + "/g/none.git/gitlab-lfs/objects/" + oid, "rep", rep, nil, http.StatusNotFound},
	} {
		if got := do(tt.method, tt.path, tt.user, tt.tok, tt.body); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
	if b, err := os.ReadFile(stored); err != nil || !bytes.Equal(b, content) {
		t.Error("a refused upload changed the stored object")
	}
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(stored))), ooid[:2], ooid[2:4], ooid)); err != nil || !bytes.Equal(b, other) {
		t.Errorf("the accepted upload is not stored as given: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(stored))), "*", "*", ".upload-*")); len(left) != 0 {
		t.Errorf("refused uploads left temporary files: %v", left)
	}
}
