package jobtoken

import (
	"context"
	"encoding/base64"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store/sqlite"
	"github.com/berthci/berth/internal/fakeclock"
)

// The signer Mint keeps is the newest key's: after a rotation seen by this
// replica (its periodic reload), new tokens carry the new key.
func TestMintSignsWithTheNewestKeyAfterARotation(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c := fakeclock.New(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	k, err := Open(ctx, Options{Store: st, Clock: c, Issuer: "https://ci.example.test"})
	if err != nil {
		t.Fatal(err)
	}
	claims := Claims{JobID: 1, Scopes: RunnerScopes, IssuedAt: c.Now(), Expires: c.Now().Add(time.Hour), HandOut: NewHandOut()}
	kid := func(tok string) string {
		t.Helper()
		h, err := base64.RawURLEncoding.DecodeString(strings.Split(strings.TrimPrefix(tok, "glcbt-"), ".")[0])
		if err != nil {
			t.Fatal(err)
		}
		return string(h)
	}
	old, err := k.Mint(ctx, claims)
	if err != nil {
		t.Fatal(err)
	}
	info, err := Rotate(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(kid(old), info.KID) {
		t.Fatal("the new key signed before the rotation")
	}
	k.mu.Lock()
	k.loaded = time.Now().Add(-signReload) // the periodic reload is due
	k.mu.Unlock()
	fresh, err := k.Mint(ctx, claims)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(kid(fresh), info.KID) {
		t.Fatalf("after the rotation the header is %s, want kid %s", kid(fresh), info.KID)
	}
	if _, err := k.Verify(ctx, fresh); err != nil {
		t.Fatal(err)
	}
}
