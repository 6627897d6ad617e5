package testenv

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Git runs git in dir with extra environment and returns its trimmed
// output, failing t on error.
func Git(t testing.TB, dir string, env []string, args ...string) string {
	t.Helper()
	out, err := GitOutput(dir, env, args...)
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// GitOutput runs git in dir isolated from the machine's configuration
// (no system config, HOME in dir, no prompts, a fixed author) with extra
// environment, and returns its trimmed output; an error carries stderr.
func GitOutput(dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "HOME="+dir,
		"GIT_AUTHOR_NAME=T", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=T", "GIT_COMMITTER_EMAIL=t@x")
	cmd.Env = append(cmd.Env, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%w: %s", err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// GitBasicAuth is the environment that makes git send HTTP basic
// credentials without putting them in a URL.
func GitBasicAuth(user, pass string) []string {
	cred := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	return []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http.extraHeader", "GIT_CONFIG_VALUE_0=Authorization: Basic " + cred}
}

// PushFiles commits files (slash-separated paths) on top of branch of the
// repository at remote, pushes the commit over HTTP as user with pass
// (opts go to git push before the remote) and returns it. A branch that
// does not exist yet starts from nothing.
func PushFiles(t testing.TB, remote, user, pass, branch string, files map[string]string, opts ...string) string {
	t.Helper()
	dir := t.TempDir()
	Git(t, dir, nil, "init", "-q", "-b", branch)
	if _, err := GitOutput(dir, GitBasicAuth(user, pass), "fetch", "-q", remote, branch); err == nil {
		Git(t, dir, nil, "reset", "-q", "--hard", "FETCH_HEAD")
	}
	WriteFiles(t, dir, files)
	Git(t, dir, nil, "add", "-A")
	Git(t, dir, nil, "commit", "-q", "-m", "change "+branch)
	args := append([]string{"push", "-q"}, opts...)
	args = append(args, remote, "HEAD:refs/heads/"+branch)
	Git(t, dir, GitBasicAuth(user, pass), args...)
	return Git(t, dir, nil, "rev-parse", "HEAD")
}

// WriteFiles writes files (slash-separated paths to contents) under dir,
// making their directories, failing t on error.
func WriteFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
