// Package gitrepo operates the coordinator's bare git repositories through
// the git binary: creating them, reading refs, commits and files of a
// commit (as an fs.FS for the CI front end), diffs for rules:changes, and
// committing a directory onto a branch (pipelines from a working tree).
//
// Every function runs git with a context; nothing here keeps state, so
// the functions are safe for concurrent use as git itself is (ref updates
// are compare-and-swap).
package gitrepo

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// ZeroSha is git's all-zero object id: "no commit" (a created or deleted
// ref in a push).
const ZeroSha = "0000000000000000000000000000000000000000"

// ErrNotFound: the ref, commit or file does not exist.
var ErrNotFound = errors.New("not found")

// Repo is one bare repository.
type Repo struct {
	// Dir is the repository directory (the bare repository itself).
	Dir string
}

// git runs git in the repository with the given extra environment and
// returns its stdout; stderr is part of the error.
func (r *Repo) git(ctx context.Context, env []string, stdin []byte, args ...string) ([]byte, error) {
	return run(ctx, r.Dir, env, stdin, args...)
}

func run(ctx context.Context, gitDir string, env []string, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = append(baseEnv(), env...)
	if gitDir != "" {
		cmd.Env = append(cmd.Env, "GIT_DIR="+gitDir)
	}
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 500 {
			msg = msg[:500] + "…"
		}
		return stdout.Bytes(), fmt.Errorf("git %s: %w: %s", args[0], err, msg)
	}
	return stdout.Bytes(), nil
}

// baseEnv is the environment git runs with: the process's, without
// anything that would point git at another repository or user config.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GIT_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
}

// OpenWorkTree is the repository of the git work tree dir is in (its git
// directory); ErrNotFound when dir is in none or git is not installed.
func OpenWorkTree(ctx context.Context, dir string) (*Repo, error) {
	out, err := run(ctx, "", nil, nil, "-C", dir, "rev-parse", "--absolute-git-dir")
	if err != nil {
		return nil, fmt.Errorf("%s is not in a git work tree: %w", dir, ErrNotFound)
	}
	return &Repo{Dir: strings.TrimSpace(string(out))}, nil
}

// Init creates a bare repository at dir (if it does not exist yet) whose
// HEAD names defaultBranch, configured for the coordinator's smart HTTP:
// pushes allowed (the coordinator authenticates them) and push options
// advertised (ci.skip).
func Init(ctx context.Context, dir, defaultBranch string) (*Repo, error) {
	if defaultBranch == "" {
		defaultBranch = "main"
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o750); err != nil {
		return nil, fmt.Errorf("creating %s: %w", filepath.Dir(dir), err)
	}
	// No template (sample hooks, description: files nobody reads), and
	// the settings written with the repository rather than by a git
	// process each.
	if _, err := run(ctx, "", nil, nil, "init", "--quiet", "--bare", "--template=", "--initial-branch="+defaultBranch, dir); err != nil {
		return nil, fmt.Errorf("creating repository %s: %w", dir, err)
	}
	r := &Repo{Dir: dir}
	f, err := os.OpenFile(filepath.Join(dir, "config"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, fmt.Errorf("configuring repository %s: %w", dir, err)
	}
	_, err = f.WriteString(repoConfig)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("configuring repository %s: %w", dir, err)
	}
	return r, nil
}

// repoConfig is what Berth's repositories add to git's defaults: pushes
// over smart HTTP with push options, fetches of any commit (a job's sha),
// no reflogs. Git merges repeated sections.
const repoConfig = `[http]
	receivepack = true
[receive]
	advertisePushOptions = true
[uploadpack]
	allowAnySHA1InWant = true
[core]
	logAllRefUpdates = false
`

// Ref is a branch or tag and the commit it points to (tags peeled).
type Ref struct {
	Name string // full name: refs/heads/main, refs/tags/v1
	Sha  string
}

// Refs returns the branches and tags, by full name.
func (r *Repo) Refs(ctx context.Context) (map[string]string, error) {
	out, err := r.git(ctx, nil, nil, "for-each-ref", "--format=%(objectname) %(*objectname) %(refname)", "refs/heads", "refs/tags")
	if err != nil {
		return nil, fmt.Errorf("listing refs of %s: %w", r.Dir, err)
	}
	refs := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		f := strings.SplitN(line, " ", 3)
		if len(f) != 3 {
			continue
		}
		sha := f[0]
		if f[1] != "" {
			sha = f[1] // annotated tag: the commit
		}
		refs[f[2]] = sha
	}
	return refs, nil
}

var shaRE = regexp.MustCompile(`^[0-9a-f]{40}$`)

// IsSha reports whether s is a full hexadecimal SHA-1 object id.
func IsSha(s string) bool { return shaRE.MatchString(s) }

// ResolveCommit returns the commit a revision names; ErrNotFound if none.
func (r *Repo) ResolveCommit(ctx context.Context, rev string) (string, error) {
	if rev == "" || strings.HasPrefix(rev, "-") {
		return "", fmt.Errorf("resolving %q: %w", rev, ErrNotFound)
	}
	out, err := r.git(ctx, nil, nil, "rev-parse", "--verify", "--quiet", "--end-of-options", rev+"^{commit}")
	if err != nil {
		return "", fmt.Errorf("resolving %q: %w", rev, ErrNotFound)
	}
	return strings.TrimSpace(string(out)), nil
}

// Commit describes a commit.
type Commit struct {
	Sha         string
	Parents     []string
	AuthorName  string
	AuthorEmail string
	AuthorDate  string // ISO 8601 (git's %aI)
	Message     string
}

// Title is the first line of the message.
func (c *Commit) Title() string {
	t, _, _ := strings.Cut(strings.TrimSpace(c.Message), "\n")
	return t
}

// Description is the message after the title and its blank line.
func (c *Commit) Description() string {
	_, d, _ := strings.Cut(strings.TrimSpace(c.Message), "\n")
	return strings.TrimSpace(d)
}

// Commit reads a commit.
func (r *Repo) Commit(ctx context.Context, sha string) (*Commit, error) {
	if !IsSha(sha) {
		return nil, fmt.Errorf("reading commit %q: %w", sha, ErrNotFound)
	}
	out, err := r.git(ctx, nil, nil, "show", "-s", "--format=%H%x00%P%x00%an%x00%ae%x00%aI%x00%B", sha)
	if err != nil {
		return nil, fmt.Errorf("reading commit %s: %w", sha, ErrNotFound)
	}
	f := strings.SplitN(string(out), "\x00", 6)
	if len(f) != 6 {
		return nil, fmt.Errorf("reading commit %s: unexpected output", sha)
	}
	c := &Commit{Sha: f[0], AuthorName: f[2], AuthorEmail: f[3], AuthorDate: f[4], Message: strings.TrimRight(f[5], "\n")}
	if f[1] != "" {
		c.Parents = strings.Fields(f[1])
	}
	return c, nil
}

// ChangedFiles lists the paths that differ between two commits. It
// returns ErrNotFound if either is not a commit of the repository.
func (r *Repo) ChangedFiles(ctx context.Context, from, to string) ([]string, error) {
	if !IsSha(from) || !IsSha(to) || from == ZeroSha {
		return nil, fmt.Errorf("diffing %s..%s: %w", from, to, ErrNotFound)
	}
	if _, err := r.ResolveCommit(ctx, from); err != nil {
		return nil, err
	}
	out, err := r.git(ctx, nil, nil, "diff", "--name-only", "--no-renames", "-z", from, to, "--")
	if err != nil {
		return nil, fmt.Errorf("diffing %s..%s: %w", from, to, err)
	}
	var files []string
	for _, p := range strings.Split(string(out), "\x00") {
		if p != "" {
			files = append(files, p)
		}
	}
	return files, nil
}

// LastCommitTouching returns the newest commit reachable from sha that
// changed path, or "" if none did.
func (r *Repo) LastCommitTouching(ctx context.Context, sha, path string) (string, error) {
	out, err := r.git(ctx, nil, nil, "log", "-1", "--format=%H", sha, "--", path)
	if err != nil {
		return "", fmt.Errorf("finding the last commit of %s: %w", path, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// UpdateRef moves ref to sha: from old only (ZeroSha: the ref must not
// exist), or whatever it was when old is "".
func (r *Repo) UpdateRef(ctx context.Context, ref, sha, old string) error {
	args := []string{"update-ref", ref, sha}
	if old != "" {
		args = append(args, old)
	}
	if _, err := r.git(ctx, nil, nil, args...); err != nil {
		return fmt.Errorf("updating %s: %w", ref, err)
	}
	return nil
}

// MergeBase returns the best common ancestor of two commits.
func (r *Repo) MergeBase(ctx context.Context, a, b string) (string, error) {
	if !IsSha(a) || !IsSha(b) {
		return "", fmt.Errorf("merge base of %s and %s: %w", a, b, ErrNotFound)
	}
	out, err := r.git(ctx, nil, nil, "merge-base", a, b)
	if err != nil {
		return "", fmt.Errorf("merge base of %s and %s: %w", a, b, ErrNotFound)
	}
	return strings.TrimSpace(string(out)), nil
}

// Remote is a repository reached over HTTP(S) with basic-auth credentials.
// The credentials go to git in its environment (http.extraHeader), never
// on a command line or in a URL other processes could see.
type Remote struct {
	URL            string
	User, Password string
}

func (rm Remote) env() []string {
	if rm.User == "" && rm.Password == "" {
		return nil
	}
	cred := base64.StdEncoding.EncodeToString([]byte(rm.User + ":" + rm.Password))
	return []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http.extraHeader", "GIT_CONFIG_VALUE_0=Authorization: Basic " + cred}
}

// FetchBranch fetches branch of the remote into the same branch of the
// repository at gitDir, at the given depth (0: full). ErrNotFound if the
// remote has no such branch.
func FetchBranch(ctx context.Context, gitDir string, rm Remote, branch string, depth int) error {
	out, err := run(ctx, gitDir, rm.env(), nil, "ls-remote", "--heads", "--", rm.URL, "refs/heads/"+branch)
	if err != nil {
		return fmt.Errorf("listing %s: %w", branch, err)
	}
	if strings.TrimSpace(string(out)) == "" {
		return fmt.Errorf("branch %s: %w", branch, ErrNotFound)
	}
	args := []string{"fetch", "--quiet", "--no-tags"}
	if depth > 0 {
		args = append(args, fmt.Sprintf("--depth=%d", depth))
	}
	args = append(args, "--", rm.URL, "+refs/heads/"+branch+":refs/heads/"+branch)
	if _, err := run(ctx, gitDir, rm.env(), nil, args...); err != nil {
		return fmt.Errorf("fetching %s: %w", branch, err)
	}
	return nil
}

// Push pushes branch of the repository at gitDir to the same branch of
// the remote, with the given push options (e.g. "ci.skip").
func Push(ctx context.Context, gitDir string, rm Remote, branch string, options ...string) error {
	args := []string{"push", "--quiet"}
	for _, o := range options {
		args = append(args, "--push-option="+o)
	}
	args = append(args, "--", rm.URL, "refs/heads/"+branch+":refs/heads/"+branch)
	if _, err := run(ctx, gitDir, rm.env(), nil, args...); err != nil {
		return fmt.Errorf("pushing %s: %w", branch, err)
	}
	return nil
}

// CreateTag creates tag name on commit sha: annotated with message when
// message is not empty (tagged by tagger), else lightweight. The ref
// update is a compare-and-swap: it fails if the tag exists.
func (r *Repo) CreateTag(ctx context.Context, name, sha, message string, tagger Author) error {
	if !IsSha(sha) || name == "" || strings.HasPrefix(name, "-") {
		return fmt.Errorf("creating tag %q at %q: %w", name, sha, ErrNotFound)
	}
	obj := sha
	if message != "" {
		if tagger.Name == "" {
			tagger = Author{Name: "Berth", Email: "berth@localhost"}
		}
		data := fmt.Sprintf("object %s\ntype commit\ntag %s\ntagger %s <%s> %d +0000\n\n%s\n",
			sha, name, tagger.Name, tagger.Email, nowUnix(), strings.TrimRight(message, "\n"))
		out, err := r.git(ctx, nil, []byte(data), "mktag")
		if err != nil {
			return fmt.Errorf("creating tag %q: %w", name, err)
		}
		obj = strings.TrimSpace(string(out))
	}
	return r.UpdateRef(ctx, "refs/tags/"+name, obj, ZeroSha)
}

// nowUnix is the tagger time of annotated tags.
var nowUnix = func() int64 { return time.Now().Unix() }
