package ssh

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"

	xssh "golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/berthci/berth/executor/config"
)

// Host key errors, the Err of a *HostKeyError.
var (
	// ErrUnknownHostKey: known_hosts has no key for the host (or the
	// file does not exist).
	ErrUnknownHostKey = errors.New("unknown host key")
	// ErrHostKeyChanged: known_hosts has other keys for the host than
	// the one it presented — a reinstalled host, or an interception.
	ErrHostKeyChanged = errors.New("host key changed")
	// ErrHostKeyRevoked: the key is marked @revoked in known_hosts.
	ErrHostKeyRevoked = errors.New("host key revoked")
)

// HostKeyError is a host key that strict host key checking refused.
type HostKeyError struct {
	// Addr is the host:port dialled.
	Addr string
	// Key is the key the host presented; nil when the known hosts file
	// could not be read at all.
	Key xssh.PublicKey
	// File is the known hosts file.
	File string
	// Known are the lines of File that name the host (ErrHostKeyChanged)
	// or revoke the key (ErrHostKeyRevoked).
	Known []knownhosts.KnownKey
	// Err is ErrUnknownHostKey, ErrHostKeyChanged or ErrHostKeyRevoked.
	Err error
}

func (e *HostKeyError) Error() string {
	var b strings.Builder
	host, port, _ := net.SplitHostPort(e.Addr)
	keyscan := "ssh-keyscan " + host
	if port != DefaultPort {
		keyscan = "ssh-keyscan -p " + port + " " + host
	}
	fmt.Fprintf(&b, "%s for %s: ", e.Err, e.Addr)
	switch {
	case e.Key == nil:
		fmt.Fprintf(&b, "known hosts file %s does not exist (check the host's fingerprint, then add its key with %q, or set disable_strict_host_key_checking = true)", e.File, keyscan+" >> "+e.File)
	case errors.Is(e.Err, ErrHostKeyRevoked):
		fmt.Fprintf(&b, "the host presented %s, which is marked @revoked", describeKey(e.Key))
		for _, k := range e.Known {
			fmt.Fprintf(&b, " at %s:%d", k.Filename, k.Line)
		}
	case errors.Is(e.Err, ErrHostKeyChanged):
		fmt.Fprintf(&b, "the host presented %s, but %s: the host was reinstalled or the connection is intercepted (after checking, replace the entry: ssh-keygen -R %s -f %s)", describeKey(e.Key), lines(e.Known), shq(knownhosts.Normalize(e.Addr)), e.File)
	default:
		fmt.Fprintf(&b, "the host presented %s, which %s does not list (check the fingerprint, then add the key with %q, or set disable_strict_host_key_checking = true)", describeKey(e.Key), e.File, keyscan+" >> "+e.File)
	}
	return b.String()
}

func (e *HostKeyError) Unwrap() error { return e.Err }

func describeKey(k xssh.PublicKey) string { return k.Type() + " key " + xssh.FingerprintSHA256(k) }

func lines(ks []knownhosts.KnownKey) string {
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%s:%d has %s", k.Filename, k.Line, describeKey(k.Key)))
	}
	return strings.Join(parts, ", ")
}

// hostKeyPolicy is disable_strict_host_key_checking and known_hosts_file.
type hostKeyPolicy struct {
	insecure bool
	file     string
	log      *slog.Logger
}

func newHostKeyPolicy(c config.SSH, log *slog.Logger) (hostKeyPolicy, error) {
	h := hostKeyPolicy{log: log}
	h.insecure = c.DisableStrictHostKeyChecking != nil && *c.DisableStrictHostKeyChecking
	file := c.KnownHostsFile
	if file == "" {
		file = "~/.ssh/known_hosts"
	}
	var err error
	if h.file, err = expandHome(file); err != nil {
		if h.insecure {
			return h, nil
		}
		return h, fmt.Errorf("ssh.known_hosts_file: %w", err)
	}
	return h, nil
}

// forHost returns the host key callback for one connection to addr and
// the host key algorithms to negotiate. The known hosts file is read on
// every connection, so edits apply to the next job.
func (h hostKeyPolicy) forHost(addr string, remote net.Addr) (xssh.HostKeyCallback, []string, error) {
	if h.insecure {
		return func(_ string, _ net.Addr, key xssh.PublicKey) error {
			h.log.Debug("accepting host key without checking (disable_strict_host_key_checking)", "addr", addr, "key", describeKey(key))
			return nil
		}, nil, nil
	}
	cb, err := knownhosts.New(h.file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, &HostKeyError{Addr: addr, File: h.file, Err: ErrUnknownHostKey}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading known hosts file: %w", err)
	}
	check := func(hostname string, remote net.Addr, key xssh.PublicKey) error {
		err := cb(hostname, remote, key)
		var ke *knownhosts.KeyError
		var re *knownhosts.RevokedError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &re):
			return &HostKeyError{Addr: addr, Key: key, File: h.file, Known: []knownhosts.KnownKey{re.Revoked}, Err: ErrHostKeyRevoked}
		case errors.As(err, &ke) && len(ke.Want) == 0:
			return &HostKeyError{Addr: addr, Key: key, File: h.file, Err: ErrUnknownHostKey}
		case errors.As(err, &ke):
			return &HostKeyError{Addr: addr, Key: key, File: h.file, Known: ke.Want, Err: ErrHostKeyChanged}
		}
		return fmt.Errorf("checking the host key against %s: %w", h.file, err)
	}
	return check, knownAlgorithms(cb, addr, remote), nil
}

// probeKey is a key no known_hosts file lists: checking it makes the
// knownhosts callback return the keys it has for a host.
var probeKey = sync.OnceValue(func() xssh.PublicKey {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	k, err := xssh.NewPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return k
})

// knownAlgorithms are the host key algorithms of the keys known_hosts
// lists for the host, in file order (nil if it lists none: the defaults).
// Without them x/crypto negotiates its own preference (ecdsa before
// ed25519) and refuses a host that known_hosts knows by another key type
// (golang/go#29286); OpenSSH orders them the same way.
func knownAlgorithms(cb xssh.HostKeyCallback, addr string, remote net.Addr) []string {
	var ke *knownhosts.KeyError
	if err := cb(addr, remote, probeKey()); !errors.As(err, &ke) {
		return nil
	}
	var algos []string
	for _, k := range ke.Want {
		for _, a := range algorithmsOf(k.Key.Type()) {
			if !slices.Contains(algos, a) {
				algos = append(algos, a)
			}
		}
	}
	return algos
}

// algorithmsOf maps a key type to the signature algorithms that use it.
func algorithmsOf(keyType string) []string {
	if keyType == xssh.KeyAlgoRSA {
		return []string{xssh.KeyAlgoRSASHA512, xssh.KeyAlgoRSASHA256, xssh.KeyAlgoRSA}
	}
	return []string{keyType}
}
