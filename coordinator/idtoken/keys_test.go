package idtoken

import (
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-jose/go-jose/v4"
)

func TestOpenCreatesPrivateKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oidc-keys")
	k, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("key directory mode %v (%v), want 0700", st.Mode().Perm(), err)
	}
	infos, err := List(dir)
	if err != nil || len(infos) != 1 || !infos[0].Signing {
		t.Fatalf("keys %+v (%v), want one signing key", infos, err)
	}
	fst, err := os.Stat(infos[0].File)
	if err != nil || fst.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v (%v), want 0600", fst.Mode().Perm(), err)
	}
	// Reopening keeps the key: tokens signed before a restart verify.
	k2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := k.Sign([]byte(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	verifyWith(t, k2, tok)
}

// verifyWith checks a compact JWS against the JWKS of k.
func verifyWith(t *testing.T, k *Keys, tok string) {
	t.Helper()
	set, err := k.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	obj, err := jose.ParseSigned(tok, []jose.SignatureAlgorithm{jose.RS256})
	if err != nil {
		t.Fatal(err)
	}
	kid := obj.Signatures[0].Header.KeyID
	keys := set.Key(kid)
	if len(keys) != 1 {
		t.Fatalf("kid %s is not in the JWKS", kid)
	}
	if _, err := obj.Verify(keys[0].Key); err != nil {
		t.Fatalf("verifying: %v", err)
	}
}

func TestRotateAndRemove(t *testing.T) {
	reloadEvery = 0
	t.Cleanup(func() { reloadEvery = defaultReloadEvery })
	dir := t.TempDir()
	k, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := k.Sign([]byte(`{}`))
	first, _ := List(dir)
	next, err := Rotate(dir)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := k.Sign([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	obj, _ := jose.ParseSigned(cur, []jose.SignatureAlgorithm{jose.RS256})
	if got := obj.Signatures[0].Header.KeyID; got != next.KID {
		t.Fatalf("signed with %s after rotation, want the new key %s", got, next.KID)
	}
	verifyWith(t, k, old)
	verifyWith(t, k, cur)
	if err := Remove(dir, next.KID); !errors.Is(err, ErrSigningKey) {
		t.Fatalf("removing the signing key: %v, want ErrSigningKey", err)
	}
	if err := Remove(dir, "nope"); !errors.Is(err, ErrNoKey) {
		t.Fatalf("removing an unknown key: %v, want ErrNoKey", err)
	}
	if err := Remove(dir, first[0].KID); err != nil {
		t.Fatal(err)
	}
	set, _ := k.JWKS()
	if len(set.Keys) != 1 || set.Keys[0].KeyID != next.KID {
		t.Fatalf("JWKS after removal %+v", set.Keys)
	}
}

func TestBrokenKeyFileIsNotEchoed(t *testing.T) {
	dir := t.TempDir()
	secret := "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWJ5dGVz\n-----END PRIVATE KEY-----\n"
	if err := os.WriteFile(filepath.Join(dir, "key-00000000000000000001.pem"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(dir)
	if err == nil || strings.Contains(err.Error(), "c2VjcmV0") {
		t.Fatalf("Open of a broken key: %v", err)
	}
}

func TestEphemeral(t *testing.T) {
	k := NewEphemeral()
	tok, err := k.Sign([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	verifyWith(t, k, tok)
}

func TestOpenLazyCreatesTheKeyWhenFirstNeeded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oidc-keys")
	k, err := OpenLazy(dir)
	if err != nil {
		t.Fatal(err)
	}
	if infos, err := List(dir); err != nil || len(infos) != 0 {
		t.Fatalf("keys after OpenLazy: %+v (%v), want none yet", infos, err)
	}
	tok, err := k.Sign([]byte(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	infos, err := List(dir)
	if err != nil || len(infos) != 1 || !infos[0].Signing {
		t.Fatalf("keys after the first Sign: %+v (%v), want one signing key", infos, err)
	}
	if st, err := os.Stat(infos[0].File); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v (%v), want 0600", st.Mode().Perm(), err)
	}
	// Another process (a restart) verifies with the key created lazily.
	k2, err := OpenLazy(dir)
	if err != nil {
		t.Fatal(err)
	}
	verifyWith(t, k2, tok)
	if infos, _ := List(dir); len(infos) != 1 {
		t.Fatalf("%d keys after reopening, want the one", len(infos))
	}
}

// TestKeyIDsDoNotLookLikeFlags: a key whose thumbprint begins with '-'
// (one in 64) is made again, so that its id passes to oidc-keys remove
// as an argument.
func TestKeyIDsDoNotLookLikeFlags(t *testing.T) {
	// Small keys, to find one of each kind quickly.
	var dashed, plain *rsa.PrivateKey
	for dashed == nil || plain == nil {
		priv, err := rsa.GenerateKey(rand.Reader, 1024)
		if err != nil {
			t.Fatal(err)
		}
		kid, err := Thumbprint(&priv.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		if kid[0] == '-' {
			dashed = priv
		} else {
			plain = priv
		}
	}
	queue := []*rsa.PrivateKey{dashed, dashed, plain, dashed}
	got, err := generateFrom(func() (*rsa.PrivateKey, error) {
		k := queue[0]
		queue = queue[1:]
		return k, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got != plain || len(queue) != 1 {
		t.Fatalf("generate took %d keys and returned the dashed one: %v", 4-len(queue), got == dashed)
	}
}
