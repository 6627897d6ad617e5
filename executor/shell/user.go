package shell

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// runAs is the user a job's stages run as (PrepareOptions.User).
type runAs struct {
	name, home, sh string
	cred           *syscall.Credential
}

// lookupRunAs resolves name (nil for "", or for the runner's own user).
// Running as another user needs root, as gitlab-runner's su does.
func lookupRunAs(name string) (*runAs, error) {
	if name == "" {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("user %q (the runner's user setting): %w", name, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("user %q: uid %q, gid %q are not numbers", name, u.Uid, u.Gid)
	}
	if uid == os.Geteuid() {
		return nil, nil
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("user %q: running jobs as another user needs the runner to run as root", name)
	}
	var groups []uint32
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("user %q: its groups: %w", name, err)
	}
	for _, id := range ids {
		if g, err := strconv.ParseUint(id, 10, 32); err == nil {
			groups = append(groups, uint32(g))
		}
	}
	return &runAs{
		name: u.Username, home: u.HomeDir, sh: loginShell(u.Username),
		cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups},
	}, nil
}

// loginShell is the user's shell from /etc/passwd ("" when not found).
func loginShell(name string) string {
	data, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(data)) {
		f := strings.Split(strings.TrimRight(line, "\n"), ":")
		if len(f) == 7 && f[0] == name {
			return f[6]
		}
	}
	return ""
}

// environ is env with the user's HOME, USER, LOGNAME and SHELL, as su
// sets them (the rest is the runner's, as su keeps it).
func (a *runAs) environ(env []string) []string {
	set := []string{"HOME=" + a.home, "USER=" + a.name, "LOGNAME=" + a.name}
	if a.sh != "" {
		set = append(set, "SHELL="+a.sh)
	}
	env = slices.DeleteFunc(env, func(kv string) bool {
		return slices.ContainsFunc(set, func(s string) bool {
			k, _, _ := strings.Cut(s, "=")
			return strings.HasPrefix(kv, k+"=")
		})
	})
	return append(env, set...)
}

// own gives the user the directories of a job: the build directory and
// those between it and the builds directory, the temporary directory and
// the cache directory (their contents stay as they are).
func (a *runAs) own(buildsDir, buildDir, tmpDir, cacheDir string) error {
	dirs := []string{tmpDir, cacheDir}
	for d := buildDir; d != buildsDir && strings.HasPrefix(d, buildsDir+string(filepath.Separator)); d = filepath.Dir(d) {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		if err := os.Lchown(d, int(a.cred.Uid), int(a.cred.Gid)); err != nil {
			return err
		}
	}
	return nil
}
