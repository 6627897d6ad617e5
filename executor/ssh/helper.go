package ssh

import (
	"bufio"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// helperBinary is the local berth binary that is uploaded as the helper.
type helperBinary struct {
	path string
	sha  string // hex SHA-256 of the contents
	size int64
	// goos and goarch are read from its ELF header: goos is "linux" for
	// an ELF executable for Linux, "" for anything else; goarch is ""
	// for a machine this package does not know.
	goos, goarch string
}

// helperCache remembers the local binary's identity (hashing it takes
// tens of milliseconds) and serialises this provider's uploads of it.
type helperCache struct {
	mu      sync.Mutex
	bin     helperBinary
	modTime time.Time
	uploads map[string]chan struct{} // by sha: a semaphore
}

// helperBinary returns the identity of the local helper, hashed again
// only when its size or modification time changed.
func (p *Provider) helperBinary() (helperBinary, error) {
	fi, err := os.Stat(p.helperPath)
	if err != nil {
		return helperBinary{}, fmt.Errorf("helper binary: %w", err)
	}
	c := &p.helper
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bin.sha != "" && c.bin.size == fi.Size() && c.modTime.Equal(fi.ModTime()) {
		return c.bin, nil
	}
	f, err := os.Open(p.helperPath)
	if err != nil {
		return helperBinary{}, fmt.Errorf("helper binary: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return helperBinary{}, fmt.Errorf("helper binary %s: %w", p.helperPath, err)
	}
	b := helperBinary{path: p.helperPath, sha: hex.EncodeToString(h.Sum(nil)), size: n}
	b.goos, b.goarch = elfPlatform(f)
	c.bin, c.modTime = b, fi.ModTime()
	return b, nil
}

// elfPlatform reads GOOS and GOARCH from an ELF header.
func elfPlatform(r io.ReaderAt) (goos, goarch string) {
	f, err := elf.NewFile(r)
	if err != nil {
		return "", ""
	}
	if f.OSABI != elf.ELFOSABI_NONE && f.OSABI != elf.ELFOSABI_LINUX {
		return "", ""
	}
	switch f.Machine {
	case elf.EM_X86_64:
		goarch = "amd64"
	case elf.EM_AARCH64:
		goarch = "arm64"
	case elf.EM_386:
		goarch = "386"
	case elf.EM_ARM:
		goarch = "arm"
	case elf.EM_RISCV:
		if f.Class == elf.ELFCLASS64 {
			goarch = "riscv64"
		}
	case elf.EM_PPC64:
		goarch = "ppc64"
		if f.Data == elf.ELFDATA2LSB {
			goarch = "ppc64le"
		}
	case elf.EM_S390:
		goarch = "s390x"
	case elf.EM_LOONGARCH:
		goarch = "loong64"
	}
	return "linux", goarch
}

// unameArch maps "uname -m" to GOARCH ("" when unknown).
func unameArch(m string) string {
	switch {
	case m == "x86_64" || m == "amd64":
		return "amd64"
	case m == "aarch64" || m == "arm64":
		return "arm64"
	case len(m) == 4 && m[0] == 'i' && strings.HasSuffix(m, "86"):
		return "386"
	case strings.HasPrefix(m, "arm"):
		return "arm"
	case m == "riscv64" || m == "ppc64le" || m == "ppc64" || m == "s390x":
		return m
	case m == "loongarch64":
		return "loong64"
	}
	return ""
}

// checkPlatform refuses a host the helper cannot run on.
func checkPlatform(pr probeResult, hb helperBinary) error {
	if pr.os != "Linux" {
		return fmt.Errorf("the host runs %s: the ssh executor needs a Linux host (stage processes are found through /proc)", pr.os)
	}
	if hb.goos != "linux" {
		return fmt.Errorf("helper binary %s is not a Linux executable: give the ssh executor a Linux build of berth", hb.path)
	}
	if arch := unameArch(pr.machine); arch != "" && hb.goarch != "" && arch != hb.goarch {
		return fmt.Errorf("the host is linux/%s but helper binary %s is built for linux/%s: give the ssh executor a build for the host", arch, hb.path, hb.goarch)
	}
	return nil
}

// installHelper uploads the helper to home/.cache/berth/helper/<sha>/berth
// unless it is already there. Uploads of one binary by this provider
// are serialised (a second job waits, then finds it there); uploads by
// other processes race harmlessly: each writes its own temporary file,
// checks it and renames it into place. Progress goes to out (may be nil).
func (p *Provider) installHelper(ctx context.Context, c *client, home string, hb helperBinary, out io.Writer) error {
	sem := p.uploadSemaphore(hb.sha)
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for another upload of the helper: %w", ctx.Err())
	}
	defer func() { <-sem }()

	dest := remoteHelper(home, hb)
	wrap := func(err error) error { return fmt.Errorf("uploading the helper to %s: %w", dest, err) }
	f, err := os.Open(hb.path)
	if err != nil {
		return wrap(err)
	}
	defer f.Close()
	s, err := c.session(ctx)
	if err != nil {
		return wrap(err)
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	stdin, err := s.StdinPipe()
	if err != nil {
		return wrap(err)
	}
	stdout, err := s.StdoutPipe()
	if err != nil {
		return wrap(err)
	}
	stderr := &tailBuffer{max: 4 << 10}
	s.Stderr = stderr
	nonce := randomHex(8)
	if err := s.Start(uploadScript(nonce, dest, hb)); err != nil {
		return wrap(c.why(err))
	}
	start := time.Now()
	sent, installed := false, false
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		switch strings.TrimPrefix(sc.Text(), nonce+" ") {
		case "present":
			stdin.Close()
		case "send":
			if out != nil {
				fmt.Fprintf(out, "Uploading the berth helper (%.1f MB) to %s...\n", float64(hb.size)/1e6, dest)
			}
			_, err := io.Copy(stdin, f)
			stdin.Close()
			sent = err == nil
		case "installed":
			installed = true
		}
	}
	werr := s.Wait()
	switch {
	case ctx.Err() != nil:
		return wrap(ctx.Err())
	case werr != nil:
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			werr = fmt.Errorf("%w: %s", werr, msg)
		}
		return wrap(c.why(werr))
	case installed && sent:
		p.log.Info("uploaded the helper", "path", dest, "sha256", hb.sha, "bytes", hb.size, "duration", time.Since(start).Round(time.Millisecond))
	case installed:
		return wrap(errors.New("the host installed a helper that was not sent"))
	}
	return nil
}

func (p *Provider) uploadSemaphore(sha string) chan struct{} {
	c := &p.helper
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.uploads == nil {
		c.uploads = map[string]chan struct{}{}
	}
	sem, ok := c.uploads[sha]
	if !ok {
		sem = make(chan struct{}, 1)
		c.uploads[sha] = sem
	}
	return sem
}

// uploadScript receives the helper on standard input unless dest is
// already there: "<nonce> present", or "<nonce> send", the bytes, then
// "<nonce> installed" once the file is checked (size, SHA-256 when the
// host has sha256sum, that it runs) and renamed into place. Temporary
// files of uploads that died more than an hour ago are removed.
func uploadScript(nonce, dest string, hb helperBinary) string {
	size := strconv.FormatInt(hb.size, 10)
	dir := dest[:strings.LastIndexByte(dest, '/')]
	return shScript(
		`umask 077`,
		`d=`+shq(dir),
		`f="$d/berth"`,
		`if [ -f "$f" ] && [ -x "$f" ] && [ $(wc -c < "$f") -eq `+size+` ]; then echo "`+nonce+` present"; exit 0; fi`,
		`mkdir -p "$d" || exit 1`,
		`find "$d" -name ".upload.*" -mmin +60 -exec rm -f {} + 2>/dev/null`,
		`t="$d/.upload.$$"`,
		`trap 'rm -f "$t"' EXIT`,
		`trap 'exit 1' HUP INT TERM`,
		`echo "`+nonce+` send"`,
		`cat > "$t" || exit 1`,
		`n=$(wc -c < "$t")`,
		`[ $n -eq `+size+` ] || { echo "received $n of `+size+` bytes" >&2; exit 1; }`,
		`if command -v sha256sum >/dev/null 2>&1; then case "$(sha256sum < "$t")" in "`+hb.sha+` "*) ;; *) echo "SHA-256 of the received file differs" >&2; exit 1;; esac; fi`,
		`chmod 755 "$t" || exit 1`,
		`"$t" --version >/dev/null 2>&1 || { echo "the uploaded helper does not run on this host (a noexec file system?)" >&2; exit 1; }`,
		`mv -f "$t" "$f" || exit 1`,
		`echo "`+nonce+` installed"`,
	)
}
