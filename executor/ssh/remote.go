package ssh

import (
	"bytes"
	"fmt"
	"path"
	"strconv"
	"strings"
	"sync"

	"github.com/berthci/berth/internal/reap"
)

// The executor talks to the host through POSIX sh scripts, each run as
// "exec /bin/sh -c '<script>'" by the remote user's login shell, so the
// login shell only has to understand exec and single quotes (sh, bash,
// dash, zsh, ksh and fish do). Scripts are one line, without backslashes
// or '!'. What a script reports comes back as lines "<nonce> <key>
// <value>" with a nonce of the call, so whatever else the host prints (a
// chatty ~/.bashrc) is never mistaken for it.

// shq quotes s as one sh word.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// shScript is the command line that runs script with /bin/sh.
func shScript(script ...string) string {
	return "exec /bin/sh -c " + shq(strings.Join(script, "; "))
}

// remoteDir renders a configured remote directory as an sh word:
// absolute paths as they are, "~", "~/…" and relative paths under the
// home directory, which the script holds in $h.
func remoteDir(p string) string {
	switch {
	case p == "~":
		return `"$h"`
	case strings.HasPrefix(p, "~/"):
		p = p[2:]
	case path.IsAbs(p):
		return shq(path.Clean(p))
	}
	if p = path.Clean(p); p == "." {
		return `"$h"`
	}
	return `"$h"/` + shq(p)
}

// probeRequest is what Prepare (and Sweep) learn and do on the host in
// one session: its home, name, platform and shells, whether the helper is
// already there, and, with dirs, the job's directories.
type probeRequest struct {
	helper helperBinary
	// dirs: create buildsDir/sub and cacheDir and an empty
	// buildsDir/sub.tmp (mode 0700). buildsDir and cacheDir are as
	// configured (see remoteDir); sub is a clean relative path.
	dirs      bool
	buildsDir string
	sub       string
	cacheDir  string
}

// probeResult is what the probe reported.
type probeResult struct {
	home       string
	host       string // uname -n
	os         string // uname -s
	machine    string // uname -m
	bash       bool
	helperSize int64 // size of the helper on the host, -1 if absent
	buildDir   string
	cacheDir   string
	completed  bool
}

func probeScript(nonce string, req probeRequest) string {
	s := []string{
		`h=$HOME`,
		`[ -n "$h" ] || { echo "HOME is not set for this user" >&2; exit 1; }`,
		`echo "` + nonce + ` home $h"`,
		`echo "` + nonce + ` uname $(uname -snm)"`,
		`command -v bash >/dev/null 2>&1 && echo "` + nonce + ` bash"`,
		`f="$h"/` + shq(helperRel(req.helper.sha)),
		`[ -f "$f" ] && [ -x "$f" ] && echo "` + nonce + ` helper $(wc -c < "$f")"`,
	}
	if req.dirs {
		s = append(s,
			`b=`+remoteDir(req.buildsDir)+`/`+shq(req.sub),
			`c=`+remoteDir(req.cacheDir),
			`mkdir -p "$b" "$c" || exit 1`,
			`rm -rf "$b.tmp" || exit 1`,
			`mkdir -m 700 "$b.tmp" || exit 1`,
			`echo "`+nonce+` build $b"`,
			`echo "`+nonce+` cache $c"`,
		)
	}
	s = append(s, `echo "`+nonce+` done"`)
	return shScript(s...)
}

// parseProbe reads the probe's output (from the host: outside input).
func parseProbe(nonce string, out []byte) (probeResult, error) {
	r := probeResult{helperSize: -1}
	for _, line := range strings.Split(string(out), "\n") {
		rest, ok := strings.CutPrefix(line, nonce+" ")
		if !ok {
			continue
		}
		key, val, _ := strings.Cut(rest, " ")
		switch key {
		case "home":
			r.home = val
		case "uname":
			f := strings.Fields(val)
			if len(f) < 3 {
				return r, fmt.Errorf("unexpected uname output %q", val)
			}
			r.os, r.host, r.machine = f[0], strings.Join(f[1:len(f)-1], " "), f[len(f)-1]
		case "bash":
			r.bash = true
		case "helper":
			n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			if err != nil || n < 0 {
				return r, fmt.Errorf("unexpected helper size %q", val)
			}
			r.helperSize = n
		case "build":
			r.buildDir = val
		case "cache":
			r.cacheDir = val
		case "done":
			r.completed = true
		}
	}
	switch {
	case !r.completed:
		return r, fmt.Errorf("the host's answer ended early")
	case !path.IsAbs(r.home):
		return r, fmt.Errorf("home directory %q is not an absolute path", r.home)
	case r.os == "":
		return r, fmt.Errorf("the host did not say what it runs")
	}
	return r, nil
}

// helperRel is where the helper lives under the remote home.
func helperRel(sha string) string { return ".cache/berth/helper/" + sha + "/berth" }

// remoteHelper is the helper's path on a host with home directory home.
func remoteHelper(home string, hb helperBinary) string {
	return path.Join(home, helperRel(hb.sha))
}

// reapCommand runs "berth helper reap" on the host: by is "--marker" or
// "--scope", sig "TERM" or "KILL". It prints "signalled N processes".
func reapCommand(helper, by, value, sig string) string {
	return "exec " + shq(helper) + " helper reap " + by + " " + shq(value) + " --signal " + sig
}

// stageWrapper is what runs one stage on the host. The script arrives on
// standard input; the wrapper writes it to file, runs it with shell in
// dir, stdout and stderr merged, with no input, and reports on its
// stderr ("<nonce> ready", "<nonce> exit <status>", or "<nonce> fail
// <why>" when the script could not be started). It survives SIGTERM (the
// trap only notes it, and a caught signal is reset in the script), so it
// outlives a graceful stop and still reports the status; a stop that
// arrives before the script started skips it (status 143). Last it execs
// the helper to kill whatever the script left behind: the helper spares
// itself, so it can do that from inside the stage's process group. Most
// stages leave nothing, and starting the helper costs tens of
// milliseconds, so the wrapper first looks with shell builtins and one
// grep: when no other process is in its process group (the wrapper is the
// group's leader: sshd's and Berth's servers give every session a group)
// and no process but itself carries the marker, it just exits. A failing
// look (no grep, no env -u) is taken as "something is left".
type stageWrapper struct {
	nonce, marker, file, dir, shell, helper string
}

func (w stageWrapper) command() string {
	run := "sh " + shq(w.file)
	if w.shell == "bash" {
		run = "bash --noprofile --norc " + shq(w.file)
	}
	n := w.nonce
	inner := strings.Join([]string{
		`trap "stop=1" TERM INT HUP`,
		`echo "` + n + ` ready" >&2`,
		`cat > ` + shq(w.file) + ` || { echo "` + n + ` fail writing the stage script" >&2; exit 125; }`,
		`if [ -n "${stop-}" ]; then rc=143; elif cd ` + shq(w.dir) + `; then ` + run + ` </dev/null 2>&1; rc=$?; else rm -f ` + shq(w.file) + `; echo "` + n + ` fail entering the build directory" >&2; exit 125; fi`,
		`rm -f ` + shq(w.file),
		`echo "` + n + ` exit $rc" >&2`,
		// Anything left in the wrapper's process group but itself (and
		// the grep that looks, gone once it has looked)?
		`self=$$; f=` + shq(w.file+".left") + `; ok=1`,
		`env -u ` + reap.Variable + ` grep -lsE "^[0-9]+ [(].*[)] [A-Za-z] [0-9]+ $self " /proc/[0-9]*/stat > "$f" 2>/dev/null; case $? in 0|2) ;; *) ok="";; esac`,
		`while read -r x; do case "$x" in "/proc/$self/stat") ;; *) [ -e "$x" ] && ok="";; esac; done < "$f"`,
		// Anything but itself carrying the marker (escaped with setsid)?
		`if [ -n "$ok" ]; then env -u ` + reap.Variable + ` grep -lsF "` + reap.Env(w.marker) + `" /proc/[0-9]*/environ > "$f" 2>/dev/null; case $? in 0|2) ;; *) ok="";; esac; while read -r x; do [ "$x" = "/proc/$self/environ" ] || ok=""; done < "$f"; fi`,
		`rm -f "$f"`,
		`if [ -n "$ok" ]; then exit 0; fi`,
		`exec ` + shq(w.helper) + ` helper reap --marker ` + shq(w.marker) + ` --signal KILL >/dev/null 2>&1`,
	}, "; ")
	return "exec env " + reap.Env(w.marker) + " /bin/sh -c " + shq(inner)
}

// control reads a stage wrapper's stderr: it picks out the wrapper's
// reports and passes every other line on to out.
type control struct {
	nonce string
	out   *stageOutput

	mu      sync.Mutex
	partial []byte
	code    int
	hasCode bool
	fail    string
	ready   chan struct{}
	exited  chan struct{}
}

func newControl(nonce string, out *stageOutput) *control {
	return &control{nonce: nonce, out: out, ready: make(chan struct{}), exited: make(chan struct{})}
}

// maxControlLine bounds a line kept back while waiting for its newline.
const maxControlLine = 4 << 10

func (c *control) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partial = append(c.partial, p...)
	for {
		i := bytes.IndexByte(c.partial, '\n')
		if i < 0 {
			break
		}
		c.line(c.partial[:i+1])
		c.partial = c.partial[i+1:]
	}
	if len(c.partial) > maxControlLine {
		c.out.Write(c.partial)
		c.partial = nil
	}
	return len(p), nil
}

// flush passes on a last line without a newline.
func (c *control) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.partial) > 0 {
		c.line(c.partial)
		c.partial = nil
	}
}

func (c *control) line(l []byte) {
	rest, ok := bytes.CutPrefix(bytes.TrimRight(l, "\r\n"), []byte(c.nonce+" "))
	if !ok {
		c.out.Write(l)
		return
	}
	key, val, _ := strings.Cut(string(rest), " ")
	switch key {
	case "ready":
		select {
		case <-c.ready:
		default:
			close(c.ready)
		}
	case "exit":
		code, err := strconv.Atoi(val)
		if err != nil || c.hasCode {
			return
		}
		c.code, c.hasCode = code, true
		close(c.exited)
	case "fail":
		c.fail = val
	}
}

// result is the script's exit status, if the wrapper reported one, and
// why the wrapper could not run it, if it said so.
func (c *control) result() (code int, ok bool, fail string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.code, c.hasCode, c.fail
}
