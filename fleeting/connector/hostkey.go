package connector

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// ErrHostKeyMismatch: the instance presented a host key the policy does not
// accept.
var ErrHostKeyMismatch = errors.New("host key mismatch")

// HostKeyPolicy decides whether to trust the host key an instance presents.
// Check is called once per connection, possibly concurrently.
type HostKeyPolicy interface {
	Check(instanceID, addr string, key ssh.PublicKey) error
}

// HostKeyFunc adapts a function to HostKeyPolicy.
type HostKeyFunc func(instanceID, addr string, key ssh.PublicKey) error

// Check implements HostKeyPolicy.
func (f HostKeyFunc) Check(id, addr string, key ssh.PublicKey) error { return f(id, addr, key) }

// AcceptAnyHostKey trusts every key (GitLab's behaviour).
func AcceptAnyHostKey() HostKeyPolicy {
	return HostKeyFunc(func(string, string, ssh.PublicKey) error { return nil })
}

// FixedHostKeys trusts only the given keys.
func FixedHostKeys(keys ...ssh.PublicKey) HostKeyPolicy {
	return HostKeyFunc(func(id, addr string, key ssh.PublicKey) error {
		for _, k := range keys {
			if bytes.Equal(k.Marshal(), key.Marshal()) {
				return nil
			}
		}
		return fmt.Errorf("instance %s at %s: %w: %s %s is not one of the %d trusted keys", id, addr, ErrHostKeyMismatch, key.Type(), ssh.FingerprintSHA256(key), len(keys))
	})
}

// KnownHosts trusts keys listed in OpenSSH known_hosts files.
func KnownHosts(files ...string) (HostKeyPolicy, error) {
	cb, err := knownhosts.New(files...)
	if err != nil {
		return nil, fmt.Errorf("reading known hosts: %w", err)
	}
	return HostKeyFunc(func(id, addr string, key ssh.PublicKey) error {
		remote, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			remote = &net.TCPAddr{}
		}
		if err := cb(addr, remote, key); err != nil {
			return fmt.Errorf("instance %s at %s: %w: %w", id, addr, ErrHostKeyMismatch, err)
		}
		return nil
	}), nil
}

// TrustOnFirstUse pins the first key seen for each (instance ID, address)
// and refuses a different one later — the mark of an address that now
// belongs to another machine (a recycled IP answering for a deleted
// instance). Keep one per fleet for the life of the process.
type TrustOnFirstUse struct {
	mu   sync.Mutex
	seen map[string][]byte
}

// NewTrustOnFirstUse returns an empty pin store.
func NewTrustOnFirstUse() *TrustOnFirstUse { return &TrustOnFirstUse{seen: map[string][]byte{}} }

// Check implements HostKeyPolicy.
func (t *TrustOnFirstUse) Check(id, addr string, key ssh.PublicKey) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := id + "\x00" + addr
	b := key.Marshal()
	if old, ok := t.seen[k]; ok && !bytes.Equal(old, b) {
		return fmt.Errorf("instance %s at %s: %w: got %s, first saw another key", id, addr, ErrHostKeyMismatch, ssh.FingerprintSHA256(key))
	}
	t.seen[k] = b
	return nil
}

// Forget drops the pin of an instance (after it was deleted).
func (t *TrustOnFirstUse) Forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.seen {
		if len(k) > len(id) && k[:len(id)] == id && k[len(id)] == 0 {
			delete(t.seen, k)
		}
	}
}
