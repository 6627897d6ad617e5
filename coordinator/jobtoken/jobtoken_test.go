package jobtoken_test

import (
	"context"
	"encoding/base64"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/jobtoken"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sqlite"
	"github.com/berthci/berth/internal/fakeclock"
)

func openStore(t testing.TB) store.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func open(t testing.TB, st store.Store, c *fakeclock.Clock, cell int64) *jobtoken.Keys {
	t.Helper()
	k, err := jobtoken.Open(context.Background(), jobtoken.Options{Store: st, Clock: c, Issuer: "https://ci.example.test", Cell: cell})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func claims(c *fakeclock.Clock) jobtoken.Claims {
	return jobtoken.Claims{JobID: 42, ProjectID: 1234, Organization: 1, Scopes: jobtoken.ScriptScopes,
		Dependencies: []int64{40, 41}, IssuedAt: c.Now(), Expires: c.Now().Add(time.Hour), HandOut: jobtoken.NewHandOut()}
}

func TestMintVerify(t *testing.T) {
	c := fakeclock.New(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	k := open(t, openStore(t), c, 3)
	in := claims(c)
	tok, err := k.Mint(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, "glcbt-") || !jobtoken.IsJWT(tok) {
		t.Fatalf("token %q", tok)
	}
	got, err := k.Verify(context.Background(), tok)
	if err != nil {
		t.Fatal(err)
	}
	if got.JobID != 42 || got.ProjectID != 1234 || got.Cell != 3 || got.Organization != 1 || got.HandOut != in.HandOut ||
		!slices.Equal(got.Scopes, jobtoken.ScriptScopes) || !got.Expires.Equal(in.Expires) {
		t.Fatalf("claims %+v", got)
	}
	if got.Allows(jobtoken.ScopeJob) || got.Allows(jobtoken.ScopeTrace) || !got.Allows(jobtoken.ScopeRepositoryRead) {
		t.Error("script scopes are wrong")
	}
	if !got.MayRead(42) || !got.MayRead(41) || got.MayRead(39) {
		t.Error("artifact reads are wrong")
	}
	// GitLab's claims, for whoever routes or inspects the token.
	payload := strings.Split(strings.TrimPrefix(tok, "glcbt-"), ".")[1]
	raw, _ := base64.RawURLEncoding.DecodeString(payload)
	for _, want := range []string{`"sub":"gid://gitlab/Ci::Build/42"`, `"aud":"gitlab-authz-token"`, `"c":"3"`, `"o":"1"`, `"p":"ya"`, `"version":"0.1.0"`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("payload %s lacks %s", raw, want)
		}
	}
	if _, err := k.Mint(context.Background(), jobtoken.Claims{JobID: 1}); err == nil {
		t.Error("a token without hand-out and expiry was minted")
	}
}

func TestVerifyRefuses(t *testing.T) {
	c := fakeclock.New(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	st := openStore(t)
	k := open(t, st, c, 1)
	tok, err := k.Mint(context.Background(), claims(c))
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(strings.TrimPrefix(tok, "glcbt-"), ".")
	raw, _ := base64.RawURLEncoding.DecodeString(parts[1])
	escalated := strings.Replace(string(raw), `"scp":["artifacts:read"`, `"scp":["job","artifacts:read"`, 1)
	forged := "glcbt-" + parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(escalated)) + "." + parts[2]

	otherCell := open(t, openStore(t), c, 2)
	otherTok, err := otherCell.Mint(context.Background(), claims(c))
	if err != nil {
		t.Fatal(err)
	}
	sameKeysOtherCell := open(t, st, c, 2)
	for name, tt := range map[string]struct {
		k   *jobtoken.Keys
		tok string
	}{
		"empty":                  {k, ""},
		"legacy random":          {k, "glcbt-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
		"no prefix":              {k, strings.TrimPrefix(tok, "glcbt-")},
		"scope escalated":        {k, forged},
		"signature cut":          {k, tok[:len(tok)-4]},
		"another cell's key":     {k, otherTok},
		"this key, another cell": {sameKeysOtherCell, tok},
		"a runner token":         {k, "glrt-t1_abc.def.ghi"},
		"two dots but no jwt":    {k, "glcbt-a.b.c"},
	} {
		if _, err := tt.k.Verify(context.Background(), tt.tok); !errors.Is(err, jobtoken.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	c.Advance(time.Hour)
	if _, err := k.Verify(context.Background(), tok); !errors.Is(err, jobtoken.ErrExpired) {
		t.Errorf("past exp: %v, want ErrExpired", err)
	}
}

// TestRotation: after a rotation the new key signs and the old tokens
// still verify, on this replica and on another one that had loaded the
// old keys only; after removing the old key they stop verifying.
func TestRotation(t *testing.T) {
	ctx := context.Background()
	c := fakeclock.New(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	st := openStore(t)
	a := open(t, st, c, 0)
	b := open(t, st, c, 0)
	old, err := a.Mint(ctx, claims(c))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := jobtoken.List(ctx, st)
	info, err := jobtoken.Rotate(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := jobtoken.Remove(ctx, st, info.KID); !errors.Is(err, jobtoken.ErrSigningKey) {
		t.Fatalf("removing the signing key: %v", err)
	}
	// A token of the new key (minted by a third replica) verifies on b,
	// which has never seen that key.
	time.Sleep(1100 * time.Millisecond) // b read the store at Open; it reads again at most once a second
	fresh, err := open(t, st, c, 0).Mint(ctx, claims(c))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(mustHeader(t, fresh), info.KID) {
		t.Fatalf("the new key does not sign: header %s", mustHeader(t, fresh))
	}
	for _, tok := range []string{old, fresh} {
		if _, err := b.Verify(ctx, tok); err != nil {
			t.Fatalf("after rotation: %v", err)
		}
	}
	if err := jobtoken.Remove(ctx, st, before[0].KID); err != nil {
		t.Fatal(err)
	}
	if err := jobtoken.Remove(ctx, st, before[0].KID); !errors.Is(err, jobtoken.ErrNoKey) {
		t.Fatalf("removing twice: %v", err)
	}
	list, _ := jobtoken.List(ctx, st)
	if len(list) != 1 || list[0].KID != info.KID || !list[0].Signing {
		t.Fatalf("keys %+v", list)
	}
	if _, err := open(t, st, c, 0).Verify(ctx, old); !errors.Is(err, jobtoken.ErrInvalid) {
		t.Fatalf("a token of a removed key: %v", err)
	}
}

func mustHeader(t *testing.T, tok string) string {
	t.Helper()
	h, err := base64.RawURLEncoding.DecodeString(strings.Split(strings.TrimPrefix(tok, "glcbt-"), ".")[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

func FuzzVerify(f *testing.F) {
	c := fakeclock.New(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	k := open(f, openStore(f), c, 1)
	tok, err := k.Mint(context.Background(), claims(c))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tok)
	f.Add("glcbt-eyJhbGciOiJIUzI1NiJ9.e30.x")
	f.Add("glcbt-..")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := k.Verify(context.Background(), s)
		if err != nil {
			if !errors.Is(err, jobtoken.ErrInvalid) && !errors.Is(err, jobtoken.ErrExpired) {
				t.Fatalf("%q: unclassified error %v", s, err)
			}
			return
		}
		if s != tok && got.HandOut == "" {
			t.Fatalf("%q verified without a hand-out id", s)
		}
	})
}

// BenchmarkMint and BenchmarkVerify: a job's hand-out mints two tokens;
// every runner request about the job verifies one.
func BenchmarkMint(b *testing.B) {
	c := fakeclock.New(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	k := open(b, openStore(b), c, 3)
	in := claims(c)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.Mint(ctx, in); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	c := fakeclock.New(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	k := open(b, openStore(b), c, 3)
	ctx := context.Background()
	tok, err := k.Mint(ctx, claims(c))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.Verify(ctx, tok); err != nil {
			b.Fatal(err)
		}
	}
}

// TestKeyIDsDoNotLookLikeFlags: an id is what an operator passes to
// berth server job-token-keys remove, where one beginning with '-' would
// read as a flag. 1 in 64 base64url ids begins with it: 400 rotations
// miss none with a chance of about 2e-3.
func TestKeyIDsDoNotLookLikeFlags(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	for range 400 {
		info, err := jobtoken.Rotate(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(info.KID, "-") {
			t.Fatalf("key id %s begins with '-'", info.KID)
		}
	}
}
