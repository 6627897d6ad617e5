package vault_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/berthci/berth/runner/vault"
	"github.com/berthci/berth/runner/vault/vaulttest"
)

func setup(t *testing.T) (*vaulttest.Server, *vaulttest.Issuer) {
	t.Helper()
	is := vaulttest.NewIssuer()
	t.Cleanup(is.Close)
	v := vaulttest.New()
	t.Cleanup(v.Close)
	v.Issuer = is.URL
	v.Roles["ci"] = vaulttest.Role{BoundAudiences: []string{"https://vault.example"}, BoundClaims: map[string]string{"project_path": "acme/app"},
		Policies: []string{"kv/data/ci/*", "secret/ci/*"}}
	v.KV2["kv"] = map[string]map[string]any{"ci/db": {"password": "pw-kv2", "port": 5432.0, "tags": []any{"a"}}, "other/x": {"y": "z"}}
	v.KV1["secret"] = map[string]map[string]any{"ci/db": {"password": "pw-kv1"}}
	return v, is
}

func login(t *testing.T, v *vaulttest.Server, is *vaulttest.Issuer, c *vault.Client, claims map[string]any, role string) (string, error) {
	t.Helper()
	jwt, err := is.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	return c.Login(context.Background(), "jwt", jwt, role)
}

var good = map[string]any{"aud": "https://vault.example", "project_path": "acme/app", "sub": "project_path:acme/app"}

func TestLoginAndRead(t *testing.T) {
	v, is := setup(t)
	ctx := context.Background()
	c := &vault.Client{URL: v.URL + "/"}
	tok, err := login(t, v, is, c, good, "ci")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ engine, mount, path, field, want string }{
		{"kv-v2", "kv", "ci/db", "password", "pw-kv2"},
		{"kv-v2", "kv", "ci/db", "port", "5432"},
		{"kv-v2", "kv", "ci/db", "tags", `["a"]`},
		{"kv-v1", "secret", "ci/db", "password", "pw-kv1"},
		{"generic", "secret", "ci/db", "password", "pw-kv1"},
	} {
		got, err := c.Read(ctx, tok, tt.engine, tt.mount, tt.path, tt.field)
		if err != nil || got != tt.want {
			t.Errorf("Read(%s %s/%s %s) = %q, %v; want %q", tt.engine, tt.mount, tt.path, tt.field, got, err, tt.want)
		}
	}
	if _, err := c.Read(ctx, tok, "kv-v2", "kv", "ci/none", "password"); !errors.Is(err, vault.ErrNotFound) {
		t.Errorf("missing secret: %v, want ErrNotFound", err)
	}
	if _, err := c.Read(ctx, tok, "kv-v2", "kv", "ci/db", "nope"); !errors.Is(err, vault.ErrNotFound) {
		t.Errorf("missing field: %v, want ErrNotFound", err)
	}
	var ae *vault.APIError
	if _, err := c.Read(ctx, tok, "kv-v2", "kv", "other/x", "y"); !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden {
		t.Errorf("read outside the policy: %v, want a 403 APIError", err)
	}
	if _, err := c.Read(ctx, "hvs.bogus", "kv-v2", "kv", "ci/db", "password"); !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden {
		t.Errorf("read with a bad token: %v, want a 403 APIError", err)
	}
	if _, err := c.Read(ctx, tok, "transit", "kv", "ci/db", "password"); !errors.Is(err, vault.ErrUnknownEngine) {
		t.Errorf("unknown engine: %v", err)
	}
	if got := v.Logins(); len(got) != 1 || got[0]["project_path"] != "acme/app" {
		t.Errorf("logins %v", got)
	}
}

func TestLoginRefused(t *testing.T) {
	v, is := setup(t)
	c := &vault.Client{URL: v.URL}
	bad := map[string]any{"aud": "https://vault.example", "project_path": "acme/other"}
	var ae *vault.APIError
	for name, tc := range map[string]struct {
		claims map[string]any
		role   string
	}{
		"bound claim":   {bad, "ci"},
		"audience":      {map[string]any{"aud": "x", "project_path": "acme/app"}, "ci"},
		"unknown role":  {good, "nope"},
		"no role given": {good, ""},
	} {
		if _, err := login(t, v, is, c, tc.claims, tc.role); !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %v, want a 400 APIError", name, err)
		}
	}
	// A token of another issuer (its own key) is refused.
	other := vaulttest.NewIssuer()
	defer other.Close()
	forged, _ := other.Sign(good)
	if _, err := c.Login(context.Background(), "jwt", forged, "ci"); !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest {
		t.Errorf("token of another issuer: %v", err)
	}
	if _, err := c.Login(context.Background(), "jwt", "", "ci"); err == nil || !strings.Contains(err.Error(), "JWT is empty") {
		t.Errorf("empty JWT: %v", err)
	}
	v.DefaultRole = "ci"
	if _, err := login(t, v, is, c, good, ""); err != nil {
		t.Errorf("login with the default role: %v", err)
	}
	if _, err := c.Login(context.Background(), "other-mount", "x", "ci"); !errors.As(err, &ae) || ae.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("login at an unmounted path: %v", err)
	}
}

func TestNamespaceAndServerErrors(t *testing.T) {
	v, is := setup(t)
	v.Namespace = "team-a"
	var ae *vault.APIError
	if _, err := login(t, v, is, &vault.Client{URL: v.URL}, good, "ci"); !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden {
		t.Errorf("without the namespace: %v", err)
	}
	c := &vault.Client{URL: v.URL, Namespace: "team-a"}
	tok, err := login(t, v, is, c, good, "ci")
	if err != nil {
		t.Fatalf("with the namespace: %v", err)
	}
	v.Fail = func(p string) int {
		if p == "kv/data/ci/db" {
			return http.StatusServiceUnavailable
		}
		return 0
	}
	if _, err := c.Read(context.Background(), tok, "kv-v2", "kv", "ci/db", "password"); !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "injected failure") {
		t.Errorf("sealed Vault: %v", err)
	}
	for _, u := range []string{"", "vault.example.com", "ftp://x"} {
		if _, err := (&vault.Client{URL: u}).Login(context.Background(), "jwt", "x", ""); err == nil || !strings.Contains(err.Error(), "VAULT_SERVER_URL") {
			t.Errorf("URL %q: %v", u, err)
		}
	}
}
