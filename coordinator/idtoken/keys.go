// Package idtoken holds the keys a coordinator signs jobs' OIDC ID tokens
// with (the id_tokens keyword) and publishes them as a JWKS.
//
// The keys live in a directory of their own (DATA/oidc-keys), one PEM file
// per key (PKCS #8, mode 0600, directory 0700), named key-<creation time in
// Unix nanoseconds>.pem. The newest key signs; every key in the directory
// verifies, so rotation is: add a key (Rotate), wait until no token signed
// with the old one is still in use (a token lives as long as its job's
// timeout), then delete the old one (Remove). A running coordinator sees
// both within a second, without a restart. Key ids are RFC 7638
// thumbprints (SHA-256, base64url), as GitLab's.
package idtoken

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Algorithm is the only signing algorithm: RS256, as GitLab's.
const Algorithm = string(jose.RS256)

// keyBits is the size of generated keys (GitLab's ci_jwt_signing_key is
// 2048 bits too).
const keyBits = 2048

// defaultReloadEvery bounds how often a Keys looks at its directory
// again; reloadEvery is it, but for tests.
const defaultReloadEvery = time.Second

var reloadEvery = defaultReloadEvery

// ErrSigningKey is returned by Remove for the key that signs: rotate
// first, so that a key is left to sign with.
var ErrSigningKey = errors.New("the newest key signs tokens; rotate before removing it")

// ErrNoKey is returned by Remove for an unknown key id.
var ErrNoKey = errors.New("no such key")

// Info describes one key.
type Info struct {
	KID     string    `json:"kid"`
	Created time.Time `json:"created"`
	// Signing is set on the newest key, the one that signs.
	Signing bool   `json:"signing"`
	File    string `json:"file,omitempty"`
}

type key struct {
	info   Info
	priv   *rsa.PrivateKey
	signer jose.Signer
}

// Keys signs with the newest key of a directory and lists all of them for
// verification. Safe for concurrent use; the directory may be changed by
// Rotate and Remove from other processes at any time.
type Keys struct {
	dir string // "" : in memory only (NewEphemeral)

	mu      sync.Mutex
	checked time.Time
	stamp   string // the key file names last loaded
	keys    []*key // oldest first
}

// Open returns the keys of dir, creating the directory and a first key
// when there is none.
func Open(dir string) (*Keys, error) {
	k, err := OpenLazy(dir)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, err := k.currentLocked(); err != nil {
		return nil, err
	}
	return k, nil
}

// OpenLazy is Open without the first key: when dir has none, it is
// generated when first needed (a token to sign, the JWKS to serve). A
// 2048-bit RSA key costs a few hundred milliseconds, which a short-lived
// coordinator that seldom signs (berth run) should not pay at start.
func OpenLazy(dir string) (*Keys, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating key directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("restricting key directory: %w", err)
	}
	k := &Keys{dir: dir}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.reloadLocked(); err != nil {
		return nil, err
	}
	return k, nil
}

// NewEphemeral returns keys held in memory only, generated on first use:
// tokens they signed cannot be verified after the process ends. For tests
// and for coordinators built without a data directory.
func NewEphemeral() *Keys { return &Keys{} }

// Sign signs payload (the JSON claims) with the signing key as a compact
// JWS with header {"alg":"RS256","kid":…,"typ":"JWT"}.
func (k *Keys) Sign(payload []byte) (string, error) {
	k.mu.Lock()
	cur, err := k.currentLocked()
	k.mu.Unlock()
	if err != nil {
		return "", err
	}
	obj, err := cur.signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("signing ID token: %w", err)
	}
	return obj.CompactSerialize()
}

// JWKS returns the public keys, newest first.
func (k *Keys) JWKS() (jose.JSONWebKeySet, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, err := k.currentLocked(); err != nil {
		return jose.JSONWebKeySet{}, err
	}
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{}}
	for i := len(k.keys) - 1; i >= 0; i-- {
		c := k.keys[i]
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: &c.priv.PublicKey, KeyID: c.info.KID, Algorithm: Algorithm, Use: "sig"})
	}
	return set, nil
}

// currentLocked returns the signing key, reloading the directory when it
// was last looked at more than reloadEvery ago (or generating the first
// key of ephemeral keys).
func (k *Keys) currentLocked() (*key, error) {
	if k.dir == "" {
		if len(k.keys) == 0 {
			priv, err := generate()
			if err != nil {
				return nil, err
			}
			c, err := newKey(priv, Info{Created: time.Now().UTC()})
			if err != nil {
				return nil, err
			}
			c.info.Signing = true
			k.keys = []*key{c}
		}
		return k.keys[len(k.keys)-1], nil
	}
	if time.Since(k.checked) >= reloadEvery {
		if err := k.reloadLocked(); err != nil {
			if len(k.keys) == 0 {
				return nil, err
			}
			// Keep signing with what was loaded; the directory is
			// looked at again on the next call.
		}
	}
	if len(k.keys) == 0 {
		if _, err := Rotate(k.dir); err != nil {
			return nil, err
		}
		if err := k.reloadLocked(); err != nil {
			return nil, err
		}
	}
	if len(k.keys) == 0 {
		return nil, fmt.Errorf("no ID token key in %s", k.dir)
	}
	return k.keys[len(k.keys)-1], nil
}

// reloadLocked reads the directory again when its key files changed.
func (k *Keys) reloadLocked() error {
	k.checked = time.Now()
	names, err := keyFiles(k.dir)
	if err != nil {
		return err
	}
	stamp := strings.Join(names, "\n")
	if stamp == k.stamp && len(k.keys) > 0 {
		return nil
	}
	old := map[string]*key{}
	for _, c := range k.keys {
		old[c.info.File] = c
	}
	var keys []*key
	for _, n := range names {
		p := filepath.Join(k.dir, n)
		if c, ok := old[p]; ok {
			keys = append(keys, c)
			continue
		}
		c, err := loadKey(p)
		if err != nil {
			return err
		}
		keys = append(keys, c)
	}
	for i, c := range keys {
		c.info.Signing = i == len(keys)-1
	}
	k.keys, k.stamp = keys, stamp
	return nil
}

// Rotate adds a new key to dir; it signs from now on (in a running
// coordinator within a second), and the older keys keep verifying until
// they are removed.
func Rotate(dir string) (Info, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Info{}, fmt.Errorf("creating key directory: %w", err)
	}
	priv, err := generate()
	if err != nil {
		return Info{}, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return Info{}, err
	}
	now := time.Now().UTC()
	// Names sort by creation; one created in the same nanosecond as the
	// newest (or earlier, with a clock set back) goes after it.
	names, err := keyFiles(dir)
	if err != nil {
		return Info{}, err
	}
	nanos := now.UnixNano()
	if len(names) > 0 {
		if last, ok := fileNanos(names[len(names)-1]); ok && last >= nanos {
			nanos = last + 1
		}
	}
	name := fmt.Sprintf("key-%020d.pem", nanos)
	tmp, err := os.CreateTemp(dir, ".key-*.tmp")
	if err != nil {
		return Info{}, fmt.Errorf("writing ID token key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return Info{}, err
	}
	if err := pem.Encode(tmp, &pem.Block{Type: "PRIVATE KEY", Bytes: der}); err != nil {
		tmp.Close()
		return Info{}, fmt.Errorf("writing ID token key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return Info{}, err
	}
	if err := tmp.Close(); err != nil {
		return Info{}, err
	}
	p := filepath.Join(dir, name)
	if err := os.Rename(tmp.Name(), p); err != nil {
		return Info{}, fmt.Errorf("writing ID token key: %w", err)
	}
	c, err := newKey(priv, Info{Created: time.Unix(0, nanos).UTC(), File: p, Signing: true})
	if err != nil {
		return Info{}, err
	}
	return c.info, nil
}

// Remove deletes the key with id kid from dir; tokens it signed no longer
// verify. The signing key cannot be removed (ErrSigningKey).
func Remove(dir, kid string) error {
	infos, err := List(dir)
	if err != nil {
		return err
	}
	for _, in := range infos {
		if in.KID != kid {
			continue
		}
		if in.Signing {
			return ErrSigningKey
		}
		if err := os.Remove(in.File); err != nil {
			return fmt.Errorf("removing key %s: %w", kid, err)
		}
		return nil
	}
	return fmt.Errorf("key %s in %s: %w", kid, dir, ErrNoKey)
}

// List describes the keys of dir, oldest first; a missing directory has
// none.
func List(dir string) ([]Info, error) {
	names, err := keyFiles(dir)
	if err != nil {
		return nil, err
	}
	var out []Info
	for i, n := range names {
		c, err := loadKey(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		c.info.Signing = i == len(names)-1
		out = append(out, c.info)
	}
	return out, nil
}

// keyFiles lists dir's key file names in creation order.
func keyFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading key directory: %w", err)
	}
	var names []string
	for _, e := range ents {
		if _, ok := fileNanos(e.Name()); ok && e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}

// fileNanos parses key-<nanos>.pem.
func fileNanos(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, "key-")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".pem")
	if !ok || len(s) != 20 {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= 0
}

func loadKey(p string) (*key, error) {
	raw, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("reading ID token key: %w", err)
	}
	// Never the key's bytes in an error: only the file name.
	block, _ := pem.Decode(raw)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("ID token key %s: not a PEM PRIVATE KEY", p)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("ID token key %s: not a PKCS #8 key", p)
	}
	priv, ok := parsed.(*rsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("ID token key %s: not an RSA key", p)
	}
	nanos, _ := fileNanos(filepath.Base(p))
	return newKey(priv, Info{Created: time.Unix(0, nanos).UTC(), File: p})
}

func newKey(priv *rsa.PrivateKey, info Info) (*key, error) {
	kid, err := Thumbprint(&priv.PublicKey)
	if err != nil {
		return nil, err
	}
	info.KID = kid
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: priv, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return nil, fmt.Errorf("ID token signer: %w", err)
	}
	return &key{info: info, priv: priv, signer: signer}, nil
}

// generate makes a key whose id (its thumbprint, base64url) does not
// begin with '-': an operator passes it to oidc-keys remove, where it
// would read as a flag. One key in 64 is made again.
func generate() (*rsa.PrivateKey, error) {
	return generateFrom(func() (*rsa.PrivateKey, error) { return rsa.GenerateKey(rand.Reader, keyBits) })
}

func generateFrom(next func() (*rsa.PrivateKey, error)) (*rsa.PrivateKey, error) {
	for {
		priv, err := next()
		if err != nil {
			return nil, fmt.Errorf("generating ID token key: %w", err)
		}
		kid, err := Thumbprint(&priv.PublicKey)
		if err != nil {
			return nil, err
		}
		if kid[0] != '-' {
			return priv, nil
		}
	}
}

// Thumbprint is the RFC 7638 thumbprint of a public key (SHA-256,
// base64url without padding): the key id.
func Thumbprint(pub *rsa.PublicKey) (string, error) {
	sum, err := (&jose.JSONWebKey{Key: pub}).Thumbprint(crypto.SHA256)
	if err != nil {
		return "", fmt.Errorf("key thumbprint: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(sum), nil
}
