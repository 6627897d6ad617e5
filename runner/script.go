package runner

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runner/cache"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runner/network"
	"github.com/berthci/berth/runnerapi"
)

// shq quotes s for POSIX sh.
func shq(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

var validVarName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Colors of the job log, as gitlab-runner prints them.
const (
	ansiBoldGreen  = "\x1b[32;1m"
	ansiBoldRed    = "\x1b[31;1m"
	ansiBoldYellow = "\x1b[0;33m"
	ansiReset      = "\x1b[0;m"
)

// scripts generates the POSIX sh script of every stage of one job.
type scripts struct {
	job        *runnerapi.JobResponse
	rc         *config.Runner
	env        executor.Environment
	vars       []runnerapi.Variable // expanded, in order; later wins
	serverURL  string               // coordinator URL for the helper
	failed     bool                 // job has failed so far (for when:)
	cacheRoot  string
	projectDir string
	// debugTrace traces every command of the shell stages (set -x).
	debugTrace bool
	// safeDirectory marks the project directory safe for git before
	// get_sources (safe_directory_checkout).
	safeDirectory bool

	// remote is the distributed cache (nil: the local cache under
	// cacheRoot). runnerToken names the runner's namespace in it,
	// urlExpiry bounds its URLs, and mask hides their signatures in the
	// job log.
	remote      *cache.S3
	runnerToken string
	urlExpiry   time.Duration
	mask        func(secrets ...string)
}

// varValue is the last value of key.
func (s *scripts) varValue(key string) string { return variableValue(s.vars, key) }

// remoteURL is the URL get_sources fetches from: the payload's repository
// URL, or with the entry's clone_url, that URL and the project's path
// (CI_PROJECT_PATH.git, else the payload's project path) with the job
// token (ssh: the git user), as gitlab-runner builds it.
func (s *scripts) remoteURL() string {
	if !s.rc.UsesCloneURL() {
		return s.job.GitInfo.RepoURL
	}
	u, _ := url.Parse(s.rc.CloneURL)
	u.Path = path.Join(u.Path, cmp.Or(s.varValue("CI_PROJECT_PATH"), projectPathOf(s.job))+".git")
	switch {
	case u.Scheme == "ssh":
		if u.User == nil {
			u.User = url.User("git")
		}
	default:
		u.User = url.UserPassword("gitlab-ci-token", s.job.Token)
	}
	return u.String()
}

func (s *scripts) fileVarDir() string { return filepath.Join(s.env.TmpDir, "file-variables") }

// prelude exports the job's variables (file variables as files in the
// temporary directory) and enters the project directory.
func (s *scripts) prelude(b *strings.Builder, enterProject bool) {
	b.WriteString("set -e\n")
	b.WriteString("if (set -o pipefail) 2>/dev/null; then set -o pipefail; fi\n")
	b.WriteString("set +x\n")
	hasFile := false
	for _, v := range s.vars {
		if v.File {
			hasFile = true
		}
	}
	if hasFile {
		fmt.Fprintf(b, "mkdir -p %s\nchmod 700 %s\n", shq(s.fileVarDir()), shq(s.fileVarDir()))
	}
	// File variables' contents are written untraced, even under
	// CI_DEBUG_TRACE: they hold keys and certificates (a client
	// certificate's key, CI_SERVER_TLS_KEY_FILE) that masking cannot
	// catch in a multi-line value; their paths are exported below.
	for _, v := range s.vars {
		if v.File && validVarName.MatchString(v.Key) {
			fmt.Fprintf(b, "printf '%%s' %s > %s\n", shq(v.Value), shq(filepath.Join(s.fileVarDir(), v.Key)))
		}
	}
	if s.debugTrace {
		// CI_DEBUG_TRACE: every command from here on, the variables'
		// exports included, as gitlab-runner traces them.
		b.WriteString("set -x\n")
	}
	for _, v := range s.vars {
		if !validVarName.MatchString(v.Key) {
			continue
		}
		if v.File {
			fmt.Fprintf(b, "export %s=%s\n", v.Key, shq(filepath.Join(s.fileVarDir(), v.Key)))
			continue
		}
		fmt.Fprintf(b, "export %s=%s\n", v.Key, shq(v.Value))
	}
	if enterProject {
		fmt.Fprintf(b, "cd %s\n", shq(s.projectDir))
	}
}

// echoCmd shows a user command in the log as gitlab-runner does.
func echoCmd(b *strings.Builder, cmd string) {
	first, _, multi := strings.Cut(strings.TrimRight(cmd, "\n"), "\n")
	if multi {
		first += " # collapsed multi-line command"
	}
	fmt.Fprintf(b, "printf '%%s\\n' %s\n", shq(ansiBoldGreen+"$ "+first+ansiReset))
}

func echoInfo(b *strings.Builder, color, msg string) {
	fmt.Fprintf(b, "printf '%%s\\n' %s\n", shq(color+msg+ansiReset))
}

// userLines appends user commands, each shown before it runs.
func userLines(b *strings.Builder, lines []string) {
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		echoCmd(b, l)
		b.WriteString(l)
		b.WriteString("\n")
	}
}

func splitLines(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	return []string{s}
}

// prepareScript is the prepare_script stage.
func (s *scripts) prepareScript() string {
	var b strings.Builder
	s.prelude(&b, false)
	b.WriteString(`printf 'Running on %s...\n' "$(hostname 2>/dev/null || uname -n)"` + "\n")
	return b.String()
}

// gitStrategy is GIT_STRATEGY with GitLab's default (fetch when the
// coordinator allows it, else clone).
func (s *scripts) gitStrategy() string {
	switch st := s.varValue("GIT_STRATEGY"); st {
	case "clone", "fetch", "none", "empty":
		return st
	}
	if s.job.AllowGitFetch {
		return "fetch"
	}
	return "clone"
}

func (s *scripts) gitDepth() int {
	if v := s.varValue("GIT_DEPTH"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			return n
		}
	}
	return s.job.GitInfo.Depth
}

// redactURL removes credentials from a URL for the log.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return u
	}
	p.User = nil
	return p.String()
}

// cleanGitConfig is clean_git_config: on unless the entry says, except
// on the shell executor and for GIT_STRATEGY none (gitlab-runner's
// default: a shell runner's directories are the user's own).
func (s *scripts) cleanGitConfig() bool {
	if s.rc.CleanGitConfig != nil {
		return *s.rc.CleanGitConfig
	}
	return s.rc.Executor != "shell" && s.gitStrategy() != "none"
}

// cleansSubmodules: clean_git_config also cleans the submodules' git
// directories, when the job sets submodules up.
func (s *scripts) cleansSubmodules() bool {
	st := s.varValue("GIT_SUBMODULE_STRATEGY")
	return st == "normal" || st == "recursive"
}

// gitConfigCleanup is a command removing the git configuration and hooks
// of the repository in dir, and with modules of its submodules, as
// gitlab-runner's clean_git_config does: every file named config and every
// directory named hooks below .git/modules.
func gitConfigCleanup(dir string, modules bool) string {
	git := shq(path.Join(dir, ".git"))
	c := fmt.Sprintf("rm -f %s/config; rm -rf %s/hooks", git, git)
	if modules {
		c += fmt.Sprintf("; if [ -d %s/modules ]; then find %s/modules \\( -type f -name config -o -type d -name hooks \\) -prune -exec rm -rf {} +; fi", git, git)
	}
	return c
}

// getSources is the get_sources stage: hooks, then clone or fetch.
func (s *scripts) getSources() string {
	var b strings.Builder
	s.prelude(&b, false)
	gi := s.job.GitInfo
	userLines(&b, splitLines(s.rc.PreGetSourcesScript))
	for _, h := range s.job.Hooks {
		if h.Name == "pre_get_sources_script" {
			userLines(&b, h.Script)
		}
	}
	strategy := s.gitStrategy()
	dir := shq(s.projectDir)
	switch {
	case strategy == "none" || strategy == "empty" || gi.RepoURL == "":
		if strategy == "empty" {
			fmt.Fprintf(&b, "rm -rf %s\n", dir)
		}
		fmt.Fprintf(&b, "mkdir -p %s\n", dir)
		echoInfo(&b, ansiBoldYellow, "Skipping Git repository setup")
	default:
		// No smudging while fetching and checking out: LFS objects come
		// with "git lfs pull" below, as gitlab-runner fetches them.
		b.WriteString("export GIT_TERMINAL_PROMPT=0 GCM_INTERACTIVE=never GIT_LFS_SKIP_SMUDGE=1\n")
		depth := s.gitDepth()
		if strategy == "clone" {
			fmt.Fprintf(&b, "rm -rf %s\n", dir)
		}
		if depth > 0 {
			echoInfo(&b, ansiBoldGreen, fmt.Sprintf("Fetching changes with git depth set to %d...", depth))
		} else {
			echoInfo(&b, ansiBoldGreen, "Fetching changes...")
		}
		// Builtins where a process would do the same: a stage's
		// processes are most of a short job's time.
		fmt.Fprintf(&b, "[ -d %s ] || mkdir -p %s\ncd %s\n", dir, dir, dir)
		if s.safeDirectory {
			// Once per directory: a global configuration that outlives
			// the job (safe_directory_checkout set on a shell runner)
			// does not grow by a line a job.
			fmt.Fprintf(&b, "git config --global --get-all safe.directory 2>/dev/null | grep -qxF %s || git config --global --add safe.directory %s || true\n", dir, dir)
		}
		remote := s.remoteURL()
		url := shq(remote)
		// clean_git_config: whatever an earlier job left in the
		// repository's configuration and hooks goes before git reads it;
		// git init writes the configuration's core section again.
		reinit := ""
		if s.cleanGitConfig() {
			reinit = gitConfigCleanup(".", s.cleansSubmodules()) + "; git init -q --template=; "
		}
		fmt.Fprintf(&b, "if [ -d .git ]; then echo 'Reinitialized existing Git repository'; %s"+
			"git remote set-url origin %s 2>/dev/null || git remote add origin %s; "+
			"else git init -q --template= && echo 'Initialized empty Git repository' && git remote add origin %s; fi\n", reinit, url, url, url)
		b.WriteString("for f in .git/index.lock .git/shallow.lock .git/HEAD.lock; do [ ! -e \"$f\" ] || rm -f \"$f\"; done\n")
		s.gitTLSConfig(&b, remote)
		refspecs := gi.Refspecs
		if len(refspecs) == 0 {
			refspecs = []string{"+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"}
		}
		fetch := "git fetch origin --no-recurse-submodules"
		for _, r := range refspecs {
			fetch += " " + shq(r)
		}
		if depth > 0 {
			fetch += " --depth " + strconv.Itoa(depth)
		}
		// GIT_FETCH_EXTRA_FLAGS replaces gitlab-runner's "--prune
		// --quiet"; "none" is no flag.
		switch extra := strings.TrimSpace(s.varValue("GIT_FETCH_EXTRA_FLAGS")); extra {
		case "":
			fetch += " --prune --quiet"
		case "none":
		default:
			for _, f := range strings.Fields(extra) {
				fetch += " " + shq(f)
			}
		}
		if depth <= 0 {
			// A full history wanted where an earlier job left a shallow
			// one: gitlab-runner's unshallowing fetch.
			fetch = fmt.Sprintf("if [ -f .git/shallow ]; then %s --unshallow; else %s; fi", fetch, fetch)
		}
		if seen := s.refsSeen(refspecs, depth); seen != "" {
			// The coordinator vouches that the refs this fetch would
			// read are those a fetch with the same digest read; if that
			// fetch was this directory's last and its refs are as it
			// left them, fetching again would bring nothing.
			read := "cat .git/berth-fetched"
			if s.env.Shell == "bash" {
				read = "<.git/berth-fetched" // no cat process
			}
			fmt.Fprintf(&b, "if [ -f .git/berth-fetched ] && [ \"$(%s)\" = \"$(%s)\" ]; then\n", read, seen)
			echoInfo(&b, ansiBoldGreen, "Skipping the fetch: the refs are those this directory fetched last")
			b.WriteString("else\n")
			b.WriteString("[ ! -e .git/berth-fetched ] || rm -f .git/berth-fetched\n")
			b.WriteString(fetch + "\n")
			fmt.Fprintf(&b, "{ %s; } > .git/berth-fetched\n", seen)
			b.WriteString("fi\n")
		} else {
			b.WriteString(fetch + "\n")
		}
		target := gi.Sha
		if target == "" {
			target = "FETCH_HEAD"
			if gi.Ref != "" {
				target = "origin/" + gi.Ref
				if gi.RefType == "tag" {
					target = "refs/tags/" + gi.Ref
				}
			}
		}
		short := target
		if len(gi.Sha) >= 8 {
			short = gi.Sha[:8]
		}
		clean := s.varValue("GIT_CLEAN_FLAGS")
		if clean == "" {
			clean = "-ffdx"
		}
		checkout, warn := s.boolVar("GIT_CHECKOUT", true)
		if warn != "" {
			echoInfo(&b, ansiBoldYellow, warn)
		}
		if checkout {
			echoInfo(&b, ansiBoldGreen, fmt.Sprintf("Checking out %s as detached HEAD (ref is %s)...", short, gi.Ref))
			fmt.Fprintf(&b, "git -c advice.detachedHead=false -c submodule.recurse=false checkout -f -q %s\n", shq(target))
			if clean != "none" {
				fmt.Fprintf(&b, "git clean %s\n", clean)
			}
			if s.lfs() {
				b.WriteString("if git lfs version >/dev/null 2>&1; then git lfs pull; fi\n")
			}
		} else {
			echoInfo(&b, ansiBoldGreen, "Skipping Git checkout")
		}
		s.submodules(&b, remote, depth, clean)
		b.WriteString("echo\n")
	}
	for _, h := range s.job.Hooks {
		if h.Name == "post_get_sources_script" {
			fmt.Fprintf(&b, "cd %s\n", dir)
			userLines(&b, h.Script)
		}
	}
	if len(splitLines(s.rc.PostGetSourcesScript)) > 0 {
		fmt.Fprintf(&b, "cd %s\n", dir)
		userLines(&b, splitLines(s.rc.PostGetSourcesScript))
	}
	return b.String()
}

// submodules is GIT_SUBMODULE_STRATEGY's part of get_sources (normal,
// recursive; none or unset: nothing), written as gitlab-runner writes it:
// init, sync, clean and reset every submodule, then update, once more
// after a sync if that fails, and clean again. GIT_SUBMODULE_PATHS limits
// it to some (pathspecs, ":(exclude)x" too), GIT_SUBMODULE_DEPTH fetches
// them shallow (default: the job's depth), GIT_SUBMODULE_UPDATE_FLAGS adds
// flags. Submodules on the coordinator's host fetch with the job token
// through a git config file of the job's (insteadOf rules, and the TLS
// files for that host; with GIT_SUBMODULE_FORCE_HTTPS, its SSH URLs too):
// git passes "-c include.path" on to the clones it starts, and each
// submodule includes the file, so that git commands in the job's script
// authenticate in them too.
func (s *scripts) submodules(b *strings.Builder, remote string, depth int, clean string) {
	recursive := false
	switch strategy := s.varValue("GIT_SUBMODULE_STRATEGY"); strategy {
	case "", "none":
		echoInfo(b, ansiBoldGreen, "Skipping Git submodules setup")
		return
	case "normal":
	case "recursive":
		recursive = true
	default:
		fmt.Fprintf(b, "printf '%%s\\n' %s >&2\nexit 1\n",
			shq(ansiBoldRed+fmt.Sprintf("ERROR: unknown GIT_SUBMODULE_STRATEGY %q (want normal, recursive or none)", strategy)+ansiReset))
		return
	}
	if v := strings.TrimSpace(s.varValue("GIT_SUBMODULE_DEPTH")); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			depth = n
		} else {
			echoInfo(b, ansiBoldYellow, fmt.Sprintf("WARNING: GIT_SUBMODULE_DEPTH: expected int got %q, using %d", v, depth))
		}
	}
	var paths []string
	if fields := strings.Fields(s.varValue("GIT_SUBMODULE_PATHS")); len(fields) > 0 {
		paths = append([]string{"--"}, fields...)
	}
	words := func(args ...[]string) string {
		var out []string
		for _, a := range args {
			for _, w := range a {
				out = append(out, shq(w))
			}
		}
		return strings.Join(out, " ")
	}
	switch {
	case recursive && depth > 0:
		echoInfo(b, ansiBoldGreen, fmt.Sprintf("Updating/initializing submodules recursively with git depth set to %d...", depth))
	case recursive:
		echoInfo(b, ansiBoldGreen, "Updating/initializing submodules recursively...")
	case depth > 0:
		echoInfo(b, ansiBoldGreen, fmt.Sprintf("Updating/initializing submodules with git depth set to %d...", depth))
	default:
		echoInfo(b, ansiBoldGreen, "Updating/initializing submodules...")
	}
	creds := filepath.Join(s.fileVarDir(), "git-submodules.config")
	s.writeSubmoduleConfig(b, remote, creds)
	foreach, update := []string{"submodule", "foreach"}, []string{"submodule", "update", "--init"}
	sync := []string{"submodule", "sync"}
	if recursive {
		foreach, update, sync = append(foreach, "--recursive"), append(update, "--recursive"), append(sync, "--recursive")
	}
	if depth > 0 {
		update = append(update, "--depth", strconv.Itoa(depth))
	}
	update = append(update, strings.Fields(s.varValue("GIT_SUBMODULE_UPDATE_FLAGS"))...)
	if clean == "none" {
		clean = "-ffdx" // gitlab-runner cleans submodules whatever the flags
	}
	cleanCmd := words(foreach) + " " + shq("git clean "+clean)
	withCreds := "git -c include.path=" + shq(creds) + " "
	fmt.Fprintf(b, "git submodule init\ngit %s\n", words(sync, paths))
	fmt.Fprintf(b, "git %s\ngit %s 'git reset --hard'\n", cleanCmd, words(foreach))
	fmt.Fprintf(b, "if %s%s; then\n", withCreds, words(update, paths))
	echoInfo(b, ansiBoldGreen, "Updated submodules")
	fmt.Fprintf(b, "git %s\nelse\n", words(sync, paths))
	echoInfo(b, ansiBoldYellow, "WARNING: Updating submodules failed. Retrying...")
	fmt.Fprintf(b, "git %s\n%s%s\ngit %s 'git reset --hard'\nfi\n", words(sync, paths), withCreds, words(update, paths), words(foreach))
	fmt.Fprintf(b, "git %s\n", cleanCmd)
	if s.lfs() {
		fmt.Fprintf(b, "if git lfs version >/dev/null 2>&1; then\n")
		echoInfo(b, ansiBoldGreen, "Pulling LFS files...")
		fmt.Fprintf(b, "%s%s 'git lfs pull'\nfi\n", withCreds, words(foreach))
	}
	// Every submodule, whatever the strategy, as gitlab-runner does.
	fmt.Fprintf(b, "git submodule foreach --recursive %s\n", shq("git config --replace-all include.path "+shq(creds)))
}

// writeSubmoduleConfig writes the git config file submodules fetch with:
// the coordinator's URL and the repository's host, each with the job
// token (url.<with token>.insteadOf <without>); with
// GIT_SUBMODULE_FORCE_HTTPS, the SSH forms of the coordinator's host too
// (git@host:, ssh://git@host[:port]); and the TLS files of that host.
// Written untraced under CI_DEBUG_TRACE: it holds the token.
func (s *scripts) writeSubmoduleConfig(b *strings.Builder, remote, path string) {
	var cfg strings.Builder
	rule := func(with, without string) {
		fmt.Fprintf(&cfg, "[url %q]\n\tinsteadOf = %q\n", with, without)
	}
	authed := func(u *url.URL) string {
		c := *u
		c.User = url.UserPassword("gitlab-ci-token", s.job.Token)
		c.Path, c.RawQuery, c.Fragment = strings.TrimSuffix(c.Path, "/")+"/", "", ""
		return c.String()
	}
	seen := map[string]bool{}
	var hosts []*url.URL
	for _, raw := range []string{s.serverURL, s.rc.CloneURL, remote} {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			continue
		}
		base := &url.URL{Scheme: u.Scheme, Host: u.Host}
		if raw != remote {
			base.Path = u.Path // the coordinator's or clone_url's path prefix
		}
		plain := strings.TrimSuffix(base.String(), "/") + "/"
		if seen[plain] {
			continue
		}
		seen[plain] = true
		rule(authed(base), plain)
		hosts = append(hosts, base)
	}
	if force, _ := s.boolVar("GIT_SUBMODULE_FORCE_HTTPS", false); len(hosts) > 0 && force {
		host := cmp.Or(s.varValue("CI_SERVER_SHELL_SSH_HOST"), s.varValue("CI_SERVER_HOST"), hosts[0].Hostname())
		with := authed(hosts[0])
		if port := s.varValue("CI_SERVER_SHELL_SSH_PORT"); port != "" && port != "22" {
			rule(with, "ssh://git@"+host+":"+port+"/")
		} else {
			rule(with, "git@"+host+":")
			rule(with, "ssh://git@"+host+"/")
		}
	}
	for _, h := range hosts {
		section := fmt.Sprintf("[http %q]\n", h.Scheme+"://"+h.Host)
		var lines string
		for _, kv := range [][2]string{{network.TLSCAFileVariable, "sslCAInfo"}, {network.TLSCertFileVariable, "sslCert"}, {network.TLSKeyFileVariable, "sslKey"}} {
			if s.varValue(kv[0]) != "" {
				lines += fmt.Sprintf("\t%s = %q\n", kv[1], filepath.Join(s.fileVarDir(), kv[0]))
			}
		}
		if lines != "" {
			cfg.WriteString(section + lines)
		}
	}
	if s.debugTrace {
		b.WriteString("set +x\n")
	}
	fmt.Fprintf(b, "(umask 077 && mkdir -p %s && printf '%%s' %s > %s)\n", shq(filepath.Dir(path)), shq(cfg.String()), shq(path))
	if s.debugTrace {
		b.WriteString("set -x\n")
	}
}

// lfs reports whether get_sources pulls Git LFS objects (where git-lfs is
// installed): unless the job's GIT_LFS_SKIP_SMUDGE is true.
func (s *scripts) lfs() bool {
	skip, _ := s.boolVar("GIT_LFS_SKIP_SMUDGE", false)
	return !skip
}

// boolVar is a bool variable as gitlab-runner reads one (boolVariable).
func (s *scripts) boolVar(key string, def bool) (bool, string) { return boolVariable(s.vars, key, def) }

// boolVariable is the bool variable key of vars as gitlab-runner reads
// one (strconv's words): unset, def; another value, def and
// gitlab-runner's warning.
func boolVariable(vars []runnerapi.Variable, key string, def bool) (bool, string) {
	raw := strings.TrimSpace(variableValue(vars, key))
	if raw == "" {
		return def, ""
	}
	v, err := strconv.ParseBool(raw)
	if err != nil {
		return def, fmt.Sprintf("WARNING: %s: expected bool got %q, using default value: %v", key, raw, def)
	}
	return v, ""
}

// gitTLSConfig makes git trust the coordinator as the runner does (the
// entry's tls-ca-file, and its client certificate), for the repository's
// host only, as GitLab's runner does: http.<scheme://host>.sslCAInfo,
// sslCert and sslKey pointing at the CI_SERVER_TLS_* file variables.
func (s *scripts) gitTLSConfig(b *strings.Builder, repoURL string) {
	u, err := url.Parse(repoURL)
	if err != nil || u.Host == "" {
		return
	}
	host := u.Scheme + "://" + u.Host
	for _, kv := range [][2]string{{network.TLSCAFileVariable, "sslCAInfo"}, {network.TLSCertFileVariable, "sslCert"}, {network.TLSKeyFileVariable, "sslKey"}} {
		if s.varValue(kv[0]) == "" {
			continue
		}
		fmt.Fprintf(b, "git config %s \"$%s\"\n", shq("http."+host+"."+kv[1]), kv[0])
	}
	if s.varValue(network.TLSCAFileVariable) != "" {
		// GIT_SSL_CAINFO in the environment overrides any sslCAInfo:
		// where it is set, git gets it and the entry's authorities in
		// one bundle for this stage.
		bundle := shq(filepath.Join(s.fileVarDir(), "git-ca-bundle.pem"))
		fmt.Fprintf(b, "if [ -n \"${GIT_SSL_CAINFO:-}\" ] && [ -f \"$GIT_SSL_CAINFO\" ]; then "+
			"cat \"$GIT_SSL_CAINFO\" \"$%s\" > %s && export GIT_SSL_CAINFO=%s; fi\n", network.TLSCAFileVariable, bundle, bundle)
	}
}

// refsSeen is a command that prints the coordinator's refs digest of the
// job and the refs its fetch writes, as they are now ("" when the job
// came without a digest: every job fetches).
func (s *scripts) refsSeen(refspecs []string, depth int) string {
	digest := s.job.GitInfo.RefsDigest
	if digest == "" || !validDigest.MatchString(digest) || s.job.GitInfo.Sha == "" {
		return ""
	}
	var dsts []string
	for _, rs := range refspecs {
		_, dst, ok := strings.Cut(strings.TrimPrefix(rs, "+"), ":")
		if !ok || !strings.HasPrefix(dst, "refs/") {
			return ""
		}
		// for-each-ref matches a prefix up to a slash: a wildcard's
		// directory lists everything below it.
		if p, wild := strings.CutSuffix(dst, "/*"); wild {
			dst = p
		} else if strings.Contains(dst, "*") {
			return ""
		}
		dsts = append(dsts, shq(dst))
	}
	return fmt.Sprintf("echo %s; git for-each-ref --format='%%(objectname) %%(refname)' %s", shq(fmt.Sprintf("%s %d", digest, depth)), strings.Join(dsts, " "))
}

var validDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// expand expands $VAR and ${VAR} with the job's variables.
func (s *scripts) expand(v string) string {
	return os.Expand(v, func(k string) string { return s.varValue(k) })
}

// cacheKey is a cache entry's key as a directory name: expanded and
// path-escaped. The key comes with GitLab's protected/non_protected
// suffix: the server adds it (ci.RunnerPayload.SeparateCaches), as
// GitLab does.
func (s *scripts) cacheKey(key string) string {
	return url.PathEscape(s.rawCacheKey(key))
}

// rawCacheKey is the key expanded, not escaped: the last part of its
// object name in a distributed cache, as GitLab names it.
func (s *scripts) rawCacheKey(key string) string {
	k := strings.TrimSpace(s.expand(key))
	if k == "" {
		k = "default"
	}
	return k
}

// cacheURL signs the distributed cache's URL of key (upload: PUT, else
// GET) and masks its signature in the job log. A key it cannot sign
// (one that leaves the project's objects, a region lookup that failed)
// becomes a warning step and "".
func (s *scripts) cacheURL(ctx context.Context, steps *[]fileStep, key string, upload bool) string {
	object, err := s.remote.ObjectName(s.runnerToken, s.job.JobInfo.ProjectID, s.rawCacheKey(key))
	var u *url.URL
	if err == nil {
		if upload {
			u, err = s.remote.UploadURL(ctx, object, s.urlExpiry)
		} else {
			u, err = s.remote.DownloadURL(ctx, object, s.urlExpiry)
		}
	}
	if err != nil {
		*steps = append(*steps, fileStep{color: ansiBoldYellow, msg: fmt.Sprintf("WARNING: cache %s: %v", s.cacheKey(key), err)})
		return ""
	}
	if s.mask != nil {
		s.mask(cache.Signature(u))
	}
	return u.String()
}

func (s *scripts) cacheFile(key string) string {
	return filepath.Join(s.cacheRoot, s.cacheKey(key), "cache.zip")
}

func (s *scripts) helper() string { return shq(s.env.Helper) + " helper" }

func policyPulls(p string) bool  { return p == "" || p == "pull" || p == "pull-push" }
func policyPushes(p string) bool { return p == "" || p == "push" || p == "pull-push" }

// cachePolicy is a cache's policy with the job's variables expanded
// (cache:policy: $VAR, GitLab 16.1), or false after adding the failure
// to steps when the result is not a policy: the stage then fails the job,
// as gitlab-runner's "unknown cache policy" does.
func (s *scripts) cachePolicy(steps *[]fileStep, c runnerapi.Cache) (string, bool) {
	p := strings.TrimSpace(s.expand(c.Policy))
	switch p {
	case "", "pull", "push", "pull-push":
		return p, true
	}
	*steps = append(*steps, fileStep{color: ansiBoldRed, msg: fmt.Sprintf("ERROR: unknown cache policy %q for cache %s", p, s.cacheKey(c.Key)), fail: true})
	return "", false
}

// whenMatches applies a cache/artifact when: to the job's state.
func whenMatches(when string, failed bool) bool {
	switch when {
	case "always":
		return true
	case "on_failure":
		return failed
	default:
		return !failed
	}
}

// restoreCache is the restore_cache stage (nil when nothing to restore).
// With a distributed cache the helper downloads the key's object (then
// its fallback keys') through pre-signed URLs signed now.
func (s *scripts) restoreCache(ctx context.Context) []fileStep {
	var steps []fileStep
	for _, c := range s.job.Cache {
		policy, ok := s.cachePolicy(&steps, c)
		if !ok {
			break
		}
		if !policyPulls(policy) {
			continue
		}
		key := s.cacheKey(c.Key)
		fallbacks := append([]string{}, c.FallbackKeys...)
		if fk := s.varValue("CACHE_FALLBACK_KEY"); fk != "" {
			fallbacks = append(fallbacks, fk)
		}
		if s.remote != nil {
			var warnings []fileStep
			st := fileStep{args: []string{"cache-extract", "--dir", s.projectDir}, orWarn: "WARNING: Failed to extract cache"}
			for _, k := range append([]string{c.Key}, fallbacks...) {
				if u := s.cacheURL(ctx, &warnings, k, false); u != "" {
					st.args = append(st.args, "--key", s.rawCacheKey(k))
					st.urls = append(st.urls, u)
				}
			}
			steps = append(steps, fileStep{color: ansiBoldGreen, msg: "Checking cache for " + key + "..."})
			steps = append(steps, warnings...)
			if len(st.urls) > 0 {
				steps = append(steps, st)
			}
			continue
		}
		args := []string{"cache-extract", "--dir", s.projectDir, "--file", s.cacheFile(c.Key)}
		for _, fk := range fallbacks {
			args = append(args, "--file", s.cacheFile(fk))
		}
		steps = append(steps, fileStep{color: ansiBoldGreen, msg: "Checking cache for " + key + "..."},
			fileStep{args: args, orWarn: "WARNING: Failed to extract cache"})
	}
	return steps
}

// archiveCache is archive_cache (or _on_failure) (nil when nothing to do).
// With a distributed cache the helper uploads the archive through a
// pre-signed URL signed now; a failed upload only warns, as in GitLab.
func (s *scripts) archiveCache(ctx context.Context, failed bool) []fileStep {
	var steps []fileStep
	for _, c := range s.job.Cache {
		policy, ok := s.cachePolicy(&steps, c)
		if !ok {
			break
		}
		if !policyPushes(policy) || !whenMatches(c.When, failed) {
			continue
		}
		key := s.cacheKey(c.Key)
		var sel []string
		for _, p := range c.Paths {
			sel = append(sel, "--path", s.expand(p))
		}
		if c.Untracked {
			sel = append(sel, "--untracked")
		}
		if s.remote != nil {
			steps = append(steps, fileStep{color: ansiBoldGreen, msg: "Creating cache " + key + "..."})
			if u := s.cacheURL(ctx, &steps, c.Key, true); u != "" {
				args := []string{"cache-archive", "--dir", s.projectDir, "--key", s.rawCacheKey(c.Key)}
				if m := s.remote.MaxUploadSize(); m > 0 {
					args = append(args, "--max-size", strconv.FormatInt(m, 10))
				}
				steps = append(steps, fileStep{args: append(args, sel...), urls: []string{u}, orWarn: "WARNING: Failed to create cache"})
			}
			continue
		}
		args := append([]string{"cache-archive", "--dir", s.projectDir, "--file", s.cacheFile(c.Key)}, sel...)
		steps = append(steps, fileStep{color: ansiBoldGreen, msg: "Creating cache " + key + "..."}, fileStep{args: args})
	}
	return steps
}

// downloadArtifacts is download_artifacts (nil without dependencies that
// have artifacts).
func (s *scripts) downloadArtifacts() []fileStep {
	var steps []fileStep
	for _, d := range s.job.Dependencies {
		if d.ArtifactsFile == nil {
			continue
		}
		tok := d.Token
		if tok == "" {
			tok = s.job.Token
		}
		steps = append(steps, fileStep{color: ansiBoldGreen, msg: fmt.Sprintf("Downloading artifacts for %s (%d)...", d.Name, d.ID)},
			fileStep{args: []string{"artifacts-download", "--url", s.serverURL, "--id", strconv.FormatInt(d.ID, 10), "--dir", s.projectDir}, token: tok})
	}
	return steps
}

// step is a step's script (step_script for "script": before_script and
// script are merged by the coordinator), wrapped by pre/post_build_script.
func (s *scripts) step(st runnerapi.Step) string {
	var b strings.Builder
	s.prelude(&b, true)
	if st.Name == "script" {
		userLines(&b, splitLines(s.rc.PreBuildScript))
	}
	userLines(&b, st.Script)
	if st.Name == "script" {
		userLines(&b, splitLines(s.rc.PostBuildScript))
	}
	return b.String()
}

// afterScript is after_script: it stops at its first failing command,
// like any stage, but its result never changes the job's.
func (s *scripts) afterScript(st runnerapi.Step) string {
	var b strings.Builder
	s.prelude(&b, true)
	userLines(&b, st.Script)
	return b.String()
}

// uploadArtifacts is upload_artifacts_on_success/_on_failure (nil when
// no artifact matches).
func (s *scripts) uploadArtifacts(failed bool) []fileStep {
	var steps []fileStep
	for _, a := range s.job.Artifacts {
		if !whenMatches(a.When, failed) {
			continue
		}
		if len(a.Paths) == 0 && !a.Untracked {
			continue
		}
		name := s.expand(a.Name)
		if name == "" {
			name = "artifacts"
		}
		name = path.Base(filepath.ToSlash(name))
		args := []string{"artifacts-upload", "--url", s.serverURL, "--id", strconv.FormatInt(s.job.ID, 10), "--dir", s.projectDir, "--name", name}
		for _, p := range a.Paths {
			args = append(args, "--path", s.expand(p))
		}
		for _, e := range a.Exclude {
			args = append(args, "--exclude", s.expand(e))
		}
		if a.Untracked {
			args = append(args, "--untracked")
		}
		if a.ArtifactFormat != "" {
			args = append(args, "--format", a.ArtifactFormat)
		}
		if a.ArtifactType != "" {
			args = append(args, "--type", a.ArtifactType)
		}
		if a.ExpireIn != "" {
			args = append(args, "--expire-in", a.ExpireIn)
		}
		steps = append(steps, fileStep{color: ansiBoldGreen, msg: "Uploading artifacts..."}, fileStep{args: args, token: s.job.Token})
	}
	return steps
}

// cleanupFileVariables removes the files of file-type variables and, with
// clean_git_config, the repository's git configuration and hooks.
func (s *scripts) cleanupFileVariables() []fileStep {
	steps := []fileStep{{removeAll: s.fileVarDir()}}
	if s.cleanGitConfig() {
		steps = append(steps, fileStep{gitConfigs: s.projectDir, gitModules: s.cleansSubmodules()})
	}
	return steps
}

// optional wraps the body of a stage that only exists when it has work:
// "" for an empty body, else the body behind the prelude.
func (s *scripts) optional(body string) string {
	if body == "" {
		return ""
	}
	var b strings.Builder
	s.prelude(&b, true)
	b.WriteString(body)
	return b.String()
}
