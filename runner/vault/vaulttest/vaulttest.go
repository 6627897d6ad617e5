// Package vaulttest is a fake Vault for tests: an httptest server speaking
// the parts of Vault's documented HTTP API a runner uses, strictly — JWT
// auth login (POST /v1/auth/<mount>/login), KV v2 reads (GET
// /v1/<mount>/data/<path>) and KV v1 reads (GET /v1/<mount>/<path>),
// tokens in X-Vault-Token, namespaces in X-Vault-Namespace, errors as
// {"errors": [...]} with Vault's status codes. Logins are checked like
// Vault's JWT auth method checks them: the token verified against an OIDC
// issuer's discovery document and JWKS (oidc_discovery_url), its audience
// against the role's bound_audiences, its claims against bound_claims.
package vaulttest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"github.com/berthci/berth/coordinator/idtoken"
)

// Role is a JWT auth role.
type Role struct {
	// BoundAudiences: the token's aud must hold one of them.
	BoundAudiences []string
	// BoundClaims: claims the token must carry with these values.
	BoundClaims map[string]string
	// Policies name the secrets a login may read: paths under a mount
	// like "kv/data/ci/*" or "secret/ci/db" ("*" at the end matches any
	// rest).
	Policies []string
}

// Server is the fake. Set its fields before the first request.
type Server struct {
	*httptest.Server
	// Issuer is the OIDC issuer tokens are verified against (discovery
	// at Issuer/.well-known/openid-configuration).
	Issuer string
	// HTTPClient fetches the issuer's documents (nil: http.DefaultClient).
	HTTPClient *http.Client
	// Mount is the JWT auth mount path ("jwt" by default).
	Mount string
	// Namespace, when set, must be sent in X-Vault-Namespace.
	Namespace string
	// DefaultRole is used by logins without a role.
	DefaultRole string
	Roles       map[string]Role
	// KV2 and KV1 hold secrets by mount and path: KV2["kv"]["ci/db"] is
	// the data of kv-v2 secret ci/db in the engine mounted at kv.
	KV2, KV1 map[string]map[string]map[string]any
	// Fail, when it returns a code for a request path, answers it.
	Fail func(path string) int

	mu     sync.Mutex
	tokens map[string]Role
	logins []map[string]any // claims of successful logins
}

// New starts a fake Vault.
func New() *Server {
	s := &Server{Mount: "jwt", Roles: map[string]Role{}, KV2: map[string]map[string]map[string]any{},
		KV1: map[string]map[string]map[string]any{}, tokens: map[string]Role{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// Logins returns the verified claims of every successful login.
func (s *Server) Logins() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]map[string]any(nil), s.logins...)
}

func answer(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, code int, msg ...string) {
	if msg == nil {
		msg = []string{}
	}
	answer(w, code, map[string]any{"errors": msg})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	p, ok := strings.CutPrefix(r.URL.Path, "/v1/")
	if !ok {
		fail(w, http.StatusNotFound)
		return
	}
	if s.Fail != nil {
		if code := s.Fail(p); code != 0 {
			fail(w, code, "injected failure")
			return
		}
	}
	if r.Header.Get("X-Vault-Request") != "true" {
		fail(w, http.StatusPreconditionFailed, "missing X-Vault-Request header")
		return
	}
	if s.Namespace != "" && r.Header.Get("X-Vault-Namespace") != s.Namespace {
		// Outside the namespace the mounts do not exist.
		fail(w, http.StatusForbidden, "permission denied")
		return
	}
	if r.Method == http.MethodPost && p == "auth/"+s.Mount+"/login" {
		s.login(w, r)
		return
	}
	if r.Method != http.MethodGet {
		fail(w, http.StatusMethodNotAllowed, "unsupported operation")
		return
	}
	s.mu.Lock()
	role, ok := s.tokens[r.Header.Get("X-Vault-Token")]
	s.mu.Unlock()
	if !ok {
		fail(w, http.StatusForbidden, "permission denied")
		return
	}
	if !allowed(role.Policies, p) {
		fail(w, http.StatusForbidden, "1 error occurred:\n\t* permission denied\n\n")
		return
	}
	mount, rest, _ := strings.Cut(p, "/")
	if kv, ok := s.KV2[mount]; ok {
		secretPath, ok := strings.CutPrefix(rest, "data/")
		data, found := kv[secretPath]
		if !ok || !found {
			fail(w, http.StatusNotFound)
			return
		}
		answer(w, http.StatusOK, map[string]any{"request_id": "r", "lease_duration": 0,
			"data": map[string]any{"data": data, "metadata": map[string]any{"version": 1}}})
		return
	}
	if kv, ok := s.KV1[mount]; ok {
		data, found := kv[rest]
		if !found {
			fail(w, http.StatusNotFound)
			return
		}
		answer(w, http.StatusOK, map[string]any{"request_id": "r", "lease_duration": 2764800, "data": data})
		return
	}
	fail(w, http.StatusForbidden, "permission denied") // Vault: no such mount
}

func allowed(policies []string, p string) bool {
	for _, pol := range policies {
		if pre, ok := strings.CutSuffix(pol, "*"); ok && strings.HasPrefix(p, pre) || pol == p {
			return true
		}
	}
	return false
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		fail(w, http.StatusBadRequest, "failed to parse JSON input: "+err.Error())
		return
	}
	for k := range body {
		if k != "jwt" && k != "role" {
			fail(w, http.StatusBadRequest, "unknown field "+k)
			return
		}
	}
	jwt, _ := body["jwt"].(string)
	if jwt == "" {
		fail(w, http.StatusBadRequest, "missing token")
		return
	}
	roleName, _ := body["role"].(string)
	if roleName == "" {
		roleName = s.DefaultRole
	}
	if roleName == "" {
		fail(w, http.StatusBadRequest, "missing role")
		return
	}
	role, ok := s.Roles[roleName]
	if !ok {
		fail(w, http.StatusBadRequest, fmt.Sprintf("role %q could not be found", roleName))
		return
	}
	hc := s.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	ctx := oidc.ClientContext(context.Background(), hc)
	prov, err := oidc.NewProvider(ctx, s.Issuer)
	if err != nil {
		fail(w, http.StatusBadRequest, "error validating token: discovery: "+err.Error())
		return
	}
	// Vault checks the audience against bound_audiences itself.
	tok, err := prov.Verifier(&oidc.Config{SkipClientIDCheck: true}).Verify(ctx, jwt)
	if err != nil {
		fail(w, http.StatusBadRequest, "error validating token: "+err.Error())
		return
	}
	audOK := len(role.BoundAudiences) == 0
	for _, a := range tok.Audience {
		for _, b := range role.BoundAudiences {
			audOK = audOK || a == b
		}
	}
	if !audOK {
		fail(w, http.StatusBadRequest, "error validating token: invalid audience (aud) claim: audience claim does not match any expected audience")
		return
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		fail(w, http.StatusBadRequest, err.Error())
		return
	}
	for k, want := range role.BoundClaims {
		if got, _ := claims[k].(string); got != want {
			fail(w, http.StatusBadRequest, fmt.Sprintf("error validating claims: claim %q does not match any associated bound claim values", k))
			return
		}
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	token := "hvs." + hex.EncodeToString(b[:])
	s.mu.Lock()
	s.tokens[token] = role
	s.logins = append(s.logins, claims)
	s.mu.Unlock()
	answer(w, http.StatusOK, map[string]any{"auth": map[string]any{"client_token": token, "policies": role.Policies, "renewable": true, "lease_duration": 2764800}})
}

// Issuer is a minimal OIDC issuer for tests that need tokens without a
// coordinator: discovery and JWKS over HTTP, RS256 tokens.
type Issuer struct {
	*httptest.Server
	keys *idtoken.Keys
}

// NewIssuer starts an issuer with a key held in memory.
func NewIssuer() *Issuer {
	is := &Issuer{keys: idtoken.NewEphemeral()}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		answer(w, http.StatusOK, map[string]any{"issuer": is.URL, "jwks_uri": is.URL + "/jwks",
			"id_token_signing_alg_values_supported": []string{"RS256"}})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, r *http.Request) {
		set, err := is.keys.JWKS()
		if err != nil {
			fail(w, http.StatusInternalServerError, err.Error())
			return
		}
		answer(w, http.StatusOK, set)
	})
	is.Server = httptest.NewServer(mux)
	return is
}

// Sign returns a token with claims plus iss, iat, nbf and exp (an hour).
func (is *Issuer) Sign(claims map[string]any) (string, error) {
	c := map[string]any{"iss": is.URL, "iat": time.Now().Unix(), "nbf": time.Now().Add(-5 * time.Second).Unix(), "exp": time.Now().Add(time.Hour).Unix()}
	for k, v := range claims {
		c[k] = v
	}
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	return is.keys.Sign(b)
}
