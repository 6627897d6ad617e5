package jobtoken

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sqlite"
	"github.com/berthci/berth/internal/fakeclock"
)

// openKeys opens the keys of a new SQLite store with opts (Store and
// Clock set here), the clock at a fixed time.
func openKeys(t *testing.T, opts Options) (*Keys, store.Store, *fakeclock.Clock) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c := fakeclock.New(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	opts.Store, opts.Clock = st, c
	k, err := Open(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return k, st, c
}

// The signer Mint keeps is the newest key's: after a rotation seen by this
// replica (its periodic reload), new tokens carry the new key.
func TestMintSignsWithTheNewestKeyAfterARotation(t *testing.T) {
	ctx := context.Background()
	k, st, c := openKeys(t, Options{Issuer: "https://ci.example.test"})
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

// Tokens are plain HS256 JWS: go-jose (what minted them before) verifies
// Berth's, with the same claims encoding/json would write, and Berth
// verifies go-jose's, so replicas of either version share tokens.
func TestTokensAreGoJoseCompatible(t *testing.T) {
	ctx := context.Background()
	// An issuer that needs escaping, and claims with every optional part.
	k, _, c := openKeys(t, Options{Issuer: `https://ci.example.test/a&b<"c">`, Cell: 7})
	in := Claims{JobID: 42, ProjectID: 1234, Organization: 9, Scopes: RunnerScopes, Dependencies: []int64{3, 5},
		IssuedAt: c.Now(), Expires: c.Now().Add(time.Hour), HandOut: NewHandOut()}
	signing := k.keys[len(k.keys)-1]
	goJoseWire := func(c Claims) any {
		var nbf *jwt.NumericDate // (go-jose's builder wrote year 0 without an iat)
		if !c.IssuedAt.IsZero() {
			nbf = jwt.NewNumericDate(c.IssuedAt.Add(-5 * time.Second))
		}
		return struct {
			jwt.Claims
			Version string  `json:"version"`
			Cell    string  `json:"c,omitempty"`
			Org     string  `json:"o,omitempty"`
			Project string  `json:"p,omitempty"`
			Scopes  []Scope `json:"scp"`
			Deps    []int64 `json:"dep,omitempty"`
		}{jwt.Claims{Subject: subjectPrefix + strconv.FormatInt(c.JobID, 10), Issuer: k.issuer,
			Audience: jwt.Audience{Audience}, IssuedAt: jwt.NewNumericDate(c.IssuedAt),
			NotBefore: nbf, Expiry: jwt.NewNumericDate(c.Expires), ID: c.HandOut},
			version, base36(k.cell), base36(c.Organization), base36(c.ProjectID), c.Scopes, c.Dependencies}
	}
	for _, in := range []Claims{in, {JobID: 1, Expires: in.Expires, HandOut: "h"}} {
		ours, err := k.Mint(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		// Same bytes as the go-jose signer writes.
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: signing.Secret},
			(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", signing.KID))
		if err != nil {
			t.Fatal(err)
		}
		payload, err := json.Marshal(goJoseWire(in))
		if err != nil {
			t.Fatal(err)
		}
		jws, err := signer.Sign(payload)
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := jws.CompactSerialize()
		if err != nil {
			t.Fatal(err)
		}
		if ours != "glcbt-"+theirs {
			t.Fatalf("minted\n%s\ngo-jose writes\n%s", ours, "glcbt-"+theirs)
		}
		got, err := k.Verify(ctx, "glcbt-"+theirs)
		if err != nil {
			t.Fatal(err)
		}
		if got.JobID != in.JobID || got.HandOut != in.HandOut || !slices.Equal(got.Scopes, in.Scopes) || !got.Expires.Equal(in.Expires) {
			t.Fatalf("claims %+v", got)
		}
		parsed, err := jwt.ParseSigned(strings.TrimPrefix(ours, "glcbt-"), []jose.SignatureAlgorithm{jose.HS256})
		if err != nil {
			t.Fatal(err)
		}
		var claims jwt.Claims
		if err := parsed.Claims(signing.Secret, &claims); err != nil || claims.ID != in.HandOut {
			t.Fatalf("go-jose reads %+v: %v", claims, err)
		}
	}
	// An audience array is a JWT's other form; another header (even one
	// naming the same key) or algorithm is not Berth's.
	tokenWith := func(header string, aud any) string {
		w := map[string]any{"sub": subjectPrefix + "42", "aud": aud, "exp": in.Expires.Unix(), "jti": "h", "c": "7", "scp": []string{"job"}}
		payload, _ := json.Marshal(w)
		return string(sign(key{Secret: signing.Secret, header: header}, payload))
	}
	if _, err := k.Verify(ctx, tokenWith(signing.header, []string{"x", Audience})); err != nil {
		t.Errorf("an audience array: %v", err)
	}
	if _, err := k.Verify(ctx, tokenWith(signing.header, "x")); !errors.Is(err, ErrInvalid) {
		t.Errorf("another audience: %v", err)
	}
	for _, h := range []string{`{"alg":"HS256","kid":"` + signing.KID + `"}`, `{"alg":"none","kid":"` + signing.KID + `","typ":"JWT"}`,
		`{"alg":"HS256","crit":["x"],"kid":"` + signing.KID + `","typ":"JWT"}`} {
		if _, err := k.Verify(ctx, tokenWith(base64.RawURLEncoding.EncodeToString([]byte(h)), Audience)); !errors.Is(err, ErrInvalid) {
			t.Errorf("header %s: %v", h, err)
		}
	}
}
