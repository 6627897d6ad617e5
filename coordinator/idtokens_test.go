package coordinator

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/idtoken"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// newOIDCEnv is a coordinator whose external URL (the tokens' issuer) is
// its own address, signing with keys in a directory of the test's.
func newOIDCEnv(t *testing.T) (*env, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "oidc-keys")
	keys, err := idtoken.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, Config{ExternalURL: ownURL}, Options{IDTokenKeys: keys})
	// The fake clock's time is the tokens' iat: verify at it.
	e.clock.Set(time.Now().UTC().Truncate(time.Second))
	return e, dir
}

// verifier checks tokens the way a relying party does, independently of
// Berth's code: OIDC discovery and the JWKS fetched over HTTP by go-oidc.
func verifier(t *testing.T, e *env, aud string) *oidc.IDTokenVerifier {
	t.Helper()
	ctx := oidc.ClientContext(context.Background(), e.http.Client())
	p, err := oidc.NewProvider(ctx, e.http.URL)
	if err != nil {
		t.Fatalf("OIDC discovery at %s: %v", e.http.URL, err)
	}
	return p.Verifier(&oidc.Config{ClientID: aud})
}

func verify(t *testing.T, e *env, aud, raw string) (map[string]any, error) {
	t.Helper()
	ctx := oidc.ClientContext(context.Background(), e.http.Client())
	tok, err := verifier(t, e, aud).Verify(ctx, raw)
	if err != nil {
		return nil, err
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		t.Fatal(err)
	}
	return claims, nil
}

func idTokenSpec() dispatch.JobSpec {
	spec := simpleSpec("deploy")
	spec.ProjectFullPath = "acme/tools/app"
	spec.PipelineID = 0
	spec.Ref, spec.RefType, spec.Sha, spec.Protected = "main", "branch", "0123456789abcdef0123456789abcdef01234567", true
	spec.Timeout = 600
	spec.PipelineSource = "push"
	spec.CIConfigPath = ".gitlab-ci.yml"
	spec.Variables = []runnerapi.Variable{
		{Key: "AUD_HOST", Value: "vault.example.com", Public: true},
		{Key: "VAULT_SERVER_URL", Value: "https://$AUD_HOST", Public: true},
		{Key: "VAULT_AUTH_ROLE", Value: "ci", Public: true},
	}
	spec.IDTokens = []ci.IDToken{
		{Name: "VAULT_ID_TOKEN", Aud: []string{"https://$AUD_HOST"}},
		{Name: "MULTI_ID_TOKEN", Aud: []string{"one", "two"}, AudList: true},
	}
	f := false
	spec.Secrets = runnerapi.Secrets{
		"DB_PASSWORD": {Vault: &runnerapi.VaultSecret{Engine: runnerapi.VaultEngine{Name: "kv-v2", Path: "kv-v2"}, Path: "production/db", Field: "password"}},
		"API_KEY":     {Vault: &runnerapi.VaultSecret{Engine: runnerapi.VaultEngine{Name: "kv-v1", Path: "secret"}, Path: "ci", Field: "key"}, File: &f, Token: "$MULTI_ID_TOKEN"},
	}
	return spec
}

func TestIDTokenHandOut(t *testing.T) {
	e, _ := newOIDCEnv(t)
	tok := e.createRunner(restapi.CreateRunnerRequest{RunUntagged: boolPtr(true)})
	id := e.enqueue(idTokenSpec())
	job := e.take(tok)
	if job.ID != id {
		t.Fatalf("job %d handed out, want %d", job.ID, id)
	}
	vt, ok := variable(job, "VAULT_ID_TOKEN")
	if !ok || !vt.Masked || vt.Public || vt.File {
		t.Fatalf("VAULT_ID_TOKEN = %+v, want a masked, non-public variable", vt)
	}
	claims, err := verify(t, e, "https://vault.example.com", vt.Value)
	if err != nil {
		t.Fatalf("verifying VAULT_ID_TOKEN against the JWKS: %v", err)
	}
	now := e.clock.Now().Unix()
	want := map[string]any{
		"iss": e.http.URL, "aud": "https://vault.example.com",
		"sub":            "project_path:acme/tools/app:ref_type:branch:ref:main",
		"namespace_path": "acme/tools", "project_id": "1", "project_path": "acme/tools/app",
		"job_namespace_path": "acme/tools", "job_project_id": "1", "job_project_path": "acme/tools/app",
		"pipeline_source": "push", "job_id": strconv.FormatInt(job.ID, 10),
		"ref": "main", "ref_type": "branch", "ref_path": "refs/heads/main", "ref_protected": "true",
		"runner_environment": "self-hosted", "sha": "0123456789abcdef0123456789abcdef01234567",
		"ci_config_ref_uri": strings.TrimPrefix(e.http.URL, "http://") + "/acme/tools/app//.gitlab-ci.yml@refs/heads/main",
		"ci_config_sha":     "0123456789abcdef0123456789abcdef01234567",
		"iat":               float64(now), "nbf": float64(now - 5), "exp": float64(now + 600),
	}
	for k, v := range want {
		if !reflect.DeepEqual(claims[k], v) {
			t.Errorf("claim %s = %#v, want %#v", k, claims[k], v)
		}
	}
	if rid, ok := claims["runner_id"].(float64); !ok || rid <= 0 {
		t.Errorf("runner_id = %#v, want the runner's id as a number", claims["runner_id"])
	}
	if jti, _ := claims["jti"].(string); len(jti) != 36 {
		t.Errorf("jti = %q, want a UUID", jti)
	}
	// Berth has no namespace ids (pipeline_id too is absent for a job
	// without a pipeline) and no users: no claim pretends otherwise.
	// Nor environment claims for a job without an environment.
	for _, k := range []string{"namespace_id", "pipeline_id", "user_id", "user_login", "user_email", "environment", "deployment_tier"} {
		if v, ok := claims[k]; ok {
			t.Errorf("claim %s = %#v, want it absent", k, v)
		}
	}

	mt, _ := variable(job, "MULTI_ID_TOKEN")
	claims, err = verify(t, e, "two", mt.Value)
	if err != nil {
		t.Fatalf("verifying MULTI_ID_TOKEN: %v", err)
	}
	if !reflect.DeepEqual(claims["aud"], []any{"one", "two"}) {
		t.Errorf("aud = %#v, want the list", claims["aud"])
	}
	if claims["jti"] == nil || claims["jti"] == mustClaims(t, vt.Value)["jti"] {
		t.Errorf("two tokens share jti %v", claims["jti"])
	}
	if _, err := verify(t, e, "https://other.example", vt.Value); err == nil {
		t.Error("a token verified for an audience it was not issued for")
	}

	// ID tokens come right after the predefined variables, before the
	// job's own (which may override them, as in GitLab).
	idx := map[string]int{}
	for i, v := range job.Variables {
		idx[v.Key] = i
	}
	if !(idx["CI_JOB_TOKEN"] < idx["VAULT_ID_TOKEN"] && idx["VAULT_ID_TOKEN"] < idx["AUD_HOST"]) {
		t.Errorf("variable order: CI_JOB_TOKEN %d, VAULT_ID_TOKEN %d, AUD_HOST %d", idx["CI_JOB_TOKEN"], idx["VAULT_ID_TOKEN"], idx["AUD_HOST"])
	}
}

func decodeSegment(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }

// mustClaims decodes a token's claims without verifying it.
func mustClaims(t *testing.T, raw string) map[string]any {
	t.Helper()
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q is not a compact JWS", raw)
	}
	var m map[string]any
	b, err := decodeSegment(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSecretsPayloadFormat(t *testing.T) {
	e, _ := newOIDCEnv(t)
	tok := e.createRunner(restapi.CreateRunnerRequest{RunUntagged: boolPtr(true)})
	e.enqueue(idTokenSpec())
	r, _ := e.request(tok, "s_test", "")
	expectCode(t, "jobs/request", r, http.StatusCreated)
	var raw struct {
		Secrets json.RawMessage `json:"secrets"`
	}
	r.json(t, &raw)
	var got any
	if err := json.Unmarshal(raw.Secrets, &got); err != nil {
		t.Fatal(err)
	}
	// GitLab's wire format (EE Ci::BuildRunnerPresenter): the server from
	// the job's raw VAULT_* variables (url and namespace null when unset,
	// role left out when unset), auth path jwt by default, the login JWT
	// the secret's token or else the job's first ID token, file and token
	// only when the job set them.
	const want = `{
	  "API_KEY": {"vault": {"engine": {"name": "kv-v1", "path": "secret"}, "path": "ci", "field": "key",
	      "server": {"url": "https://$AUD_HOST", "namespace": null,
	                 "auth": {"name": "jwt", "path": "jwt", "data": {"jwt": "$MULTI_ID_TOKEN", "role": "ci"}}}},
	    "file": false, "token": "$MULTI_ID_TOKEN"},
	  "DB_PASSWORD": {"vault": {"engine": {"name": "kv-v2", "path": "kv-v2"}, "path": "production/db", "field": "password",
	      "server": {"url": "https://$AUD_HOST", "namespace": null,
	                 "auth": {"name": "jwt", "path": "jwt", "data": {"jwt": "$VAULT_ID_TOKEN", "role": "ci"}}}}}
	}`
	var wantV any
	if err := json.Unmarshal([]byte(want), &wantV); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, wantV) {
		t.Errorf("secrets = %s\nwant %s", raw.Secrets, want)
	}

	// VAULT_AUTH_PATH and VAULT_NAMESPACE when set; no role without
	// VAULT_AUTH_ROLE.
	spec := idTokenSpec()
	spec.Variables = []runnerapi.Variable{{Key: "VAULT_SERVER_URL", Value: "https://v"}, {Key: "VAULT_AUTH_PATH", Value: "gitlab"}, {Key: "VAULT_NAMESPACE", Value: "team"}}
	e.enqueue(spec)
	job := e.take(tok)
	var secrets runnerapi.Secrets
	if err := json.Unmarshal(job.Secrets, &secrets); err != nil {
		t.Fatal(err)
	}
	srv := secrets["DB_PASSWORD"].Vault.Server
	if srv == nil || *srv.URL != "https://v" || *srv.Namespace != "team" || srv.Auth.Path != "gitlab" || srv.Auth.Data.Role != nil {
		t.Errorf("server = %+v", srv)
	}
}

func TestIDTokenKeyRotation(t *testing.T) {
	e, dir := newOIDCEnv(t)
	tok := e.createRunner(restapi.CreateRunnerRequest{RunUntagged: boolPtr(true)})
	handOut := func() string {
		t.Helper()
		e.enqueue(idTokenSpec())
		v, _ := variable(e.take(tok), "VAULT_ID_TOKEN")
		return v.Value
	}
	kid := func(raw string) string {
		t.Helper()
		b, err := decodeSegment(strings.Split(raw, ".")[0])
		if err != nil {
			t.Fatal(err)
		}
		var h struct{ Kid, Alg, Typ string }
		if err := json.Unmarshal(b, &h); err != nil {
			t.Fatal(err)
		}
		if h.Alg != "RS256" || h.Typ != "JWT" {
			t.Errorf("header %+v, want alg RS256, typ JWT", h)
		}
		return h.Kid
	}
	const aud = "https://vault.example.com"
	old := handOut()
	oldKID := kid(old)
	infos, err := idtoken.List(dir)
	if err != nil || len(infos) != 1 || infos[0].KID != oldKID {
		t.Fatalf("keys %+v (%v), want the one that signed (kid %s)", infos, err, oldKID)
	}

	rotated, err := idtoken.Rotate(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The running coordinator notices the new key by itself.
	var cur string
	waitFor(t, "the new key to sign", func() bool {
		cur = handOut()
		return kid(cur) == rotated.KID
	})
	for name, raw := range map[string]string{"old": old, "new": cur} {
		if _, err := verify(t, e, aud, raw); err != nil {
			t.Errorf("%s token after rotation: %v", name, err)
		}
	}
	var set struct {
		Keys []struct{ Kid, Use, Alg, Kty string }
	}
	r := e.do("GET", "/oauth/discovery/keys", nil, nil)
	expectCode(t, "JWKS", r, http.StatusOK)
	r.json(t, &set)
	if len(set.Keys) != 2 || set.Keys[0].Kid != rotated.KID || set.Keys[1].Kid != oldKID || set.Keys[0].Alg != "RS256" || set.Keys[0].Use != "sig" || set.Keys[0].Kty != "RSA" {
		t.Errorf("JWKS %+v, want the new key then the old one", set.Keys)
	}

	if err := idtoken.Remove(dir, rotated.KID); err == nil {
		t.Error("removing the signing key succeeded")
	}
	if err := idtoken.Remove(dir, oldKID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the old key to leave the JWKS", func() bool {
		r := e.do("GET", "/-/jwks", nil, nil)
		r.json(t, &set)
		return len(set.Keys) == 1
	})
	if _, err := verify(t, e, aud, old); err == nil {
		t.Error("a token of a removed key still verifies")
	}
	if _, err := verify(t, e, aud, cur); err != nil {
		t.Errorf("token of the current key: %v", err)
	}
}

func TestOpenIDConfiguration(t *testing.T) {
	e, _ := newOIDCEnv(t)
	r := e.do("GET", "/.well-known/openid-configuration", nil, nil)
	expectCode(t, "discovery", r, http.StatusOK)
	var doc map[string]any
	r.json(t, &doc)
	if doc["issuer"] != e.http.URL || doc["jwks_uri"] != e.http.URL+"/oauth/discovery/keys" {
		t.Errorf("issuer %v, jwks_uri %v", doc["issuer"], doc["jwks_uri"])
	}
	if !reflect.DeepEqual(doc["id_token_signing_alg_values_supported"], []any{"RS256"}) {
		t.Errorf("id_token_signing_alg_values_supported = %v", doc["id_token_signing_alg_values_supported"])
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
}

func TestIDTokenSpecValidation(t *testing.T) {
	spec := idTokenSpec()
	spec.IDTokens = nil
	if err := spec.Validate(); err != nil {
		t.Errorf("secrets without ID tokens (the job fails at hand-out, as in GitLab at run time): %v", err)
	}
	spec = idTokenSpec()
	spec.IDTokens = append(spec.IDTokens, ci.IDToken{Name: "VAULT_ID_TOKEN", Aud: []string{"x"}})
	if err := spec.Validate(); err == nil || !strings.Contains(err.Error(), "defined twice") {
		t.Errorf("duplicate ID token: %v", err)
	}
	spec = idTokenSpec()
	spec.Secrets["X"] = runnerapi.Secret{}
	if err := spec.Validate(); err == nil || !strings.Contains(err.Error(), "exactly one of vault, gcp_secret_manager") {
		t.Errorf("secret without provider: %v", err)
	}
	spec = idTokenSpec()
	spec.Secrets["X"] = runnerapi.Secret{GCPSecretManager: &runnerapi.GCPSecretManagerSecret{Name: "n"}}
	if err := spec.Validate(); err == nil || !strings.Contains(err.Error(), "gcp_secret_manager.name and token are required") {
		t.Errorf("gcp secret without token: %v", err)
	}
	spec = idTokenSpec()
	spec.IDTokens = nil
	spec.Secrets = runnerapi.Secrets{"X": {AWSSecretsManager: &runnerapi.AWSSecretsManagerSecret{SecretID: "s"}}}
	if err := spec.Validate(); err != nil {
		t.Errorf("aws secret without ID tokens (the runner's own credentials): %v", err)
	}
}

// TestPipelineIDTokensAndSecrets: id_tokens and secrets written in
// .gitlab-ci.yml reach the payload of a pushed pipeline's job, the token
// carrying the pipeline's claims.
func TestPipelineIDTokensAndSecrets(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.clock.Set(time.Now().UTC().Truncate(time.Second))
	e.createProject(t, "acme/app")
	const cfg = `
variables:
  VAULT_SERVER_URL: https://vault.example.com
  VAULT_AUTH_ROLE: app-$CI_COMMIT_REF_NAME
default:
  id_tokens:
    VAULT_ID_TOKEN:
      aud: $CI_SERVER_URL/$CI_PROJECT_PATH
deploy:
  script: [deploy]
  environment:
    name: production
    deployment_tier: staging
  id_tokens:
    CLOUD_TOKEN:
      aud: [sts.example.com]
  secrets:
    DB_PASSWORD:
      vault: production/db/password@ops
`
	sha := e.pushFiles(t, "acme/app", "main", map[string]string{".gitlab-ci.yml": cfg})
	tok := e.createRunner(restapi.CreateRunnerRequest{RunUntagged: boolPtr(true)})
	job := e.takeWait(tok)
	// The job's own id_tokens replace default:'s, as any default key.
	if _, ok := variable(job, "VAULT_ID_TOKEN"); ok {
		t.Errorf("VAULT_ID_TOKEN of default: given to a job with its own id_tokens")
	}
	ct, ok := variable(job, "CLOUD_TOKEN")
	if !ok {
		t.Fatal("no CLOUD_TOKEN variable")
	}
	claims, err := verify(t, e, "sts.example.com", ct.Value)
	if err != nil {
		t.Fatalf("verifying CLOUD_TOKEN: %v", err)
	}
	want := map[string]any{
		"pipeline_id": strconv.FormatInt(job.JobInfo.PipelineID, 10), "pipeline_source": "push",
		"sub": "project_path:acme/app:ref_type:branch:ref:main", "project_visibility": "private",
		"environment": "production", "deployment_tier": "staging", "environment_action": "start",
		"ci_config_ref_uri": strings.TrimPrefix(e.http.URL, "http://") + "/acme/app//.gitlab-ci.yml@refs/heads/main",
		"sha":               sha, "ci_config_sha": sha, "aud": []any{"sts.example.com"},
	}
	for k, v := range want {
		if !reflect.DeepEqual(claims[k], v) {
			t.Errorf("claim %s = %#v, want %#v", k, claims[k], v)
		}
	}
	// A secret without token logs in with the job's first ID token; the
	// Vault server comes from the pipeline's raw variables.
	var secrets map[string]any
	if err := json.Unmarshal(job.Secrets, &secrets); err != nil {
		t.Fatalf("secrets %s: %v", job.Secrets, err)
	}
	var want2 any
	_ = json.Unmarshal([]byte(`{"DB_PASSWORD": {"vault": {"engine": {"name": "kv-v2", "path": "ops"}, "path": "production/db", "field": "password",
	  "server": {"url": "https://vault.example.com", "namespace": null,
	    "auth": {"name": "jwt", "path": "jwt", "data": {"jwt": "$CLOUD_TOKEN", "role": "app-$CI_COMMIT_REF_NAME"}}}}}}`), &want2)
	if !reflect.DeepEqual(secrets, want2) {
		t.Errorf("secrets = %s", job.Secrets)
	}
}

// The cloud secret managers gitlab-runner resolves: each secret in GitLab's
// wire format (EE Ci::BuildRunnerPresenter, gitlab-runner's common/spec),
// the server from the job's raw variables, each secret with its own token
// (GitLab gives every secret of a provider the first one's).
func TestPipelineCloudSecrets(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "acme/app")
	const cfg = `
variables:
  GCP_PROJECT_NUMBER: "1234"
  GCP_WORKLOAD_IDENTITY_FEDERATION_POOL_ID: pool
  GCP_WORKLOAD_IDENTITY_FEDERATION_PROVIDER_ID: provider
  AZURE_KEY_VAULT_SERVER_URL: https://kv.example.net
  AZURE_CLIENT_ID: client
  AZURE_TENANT_ID: tenant
  AWS_REGION: eu-west-1
  AWS_ROLE_ARN: arn:aws:iam::1:role/ci
deploy:
  script: [deploy]
  id_tokens:
    GCP_TOKEN: {aud: gcp}
    AZURE_TOKEN: {aud: azure}
    AWS_ID_TOKEN: {aud: aws}
  secrets:
    G1:
      gcp_secret_manager: {name: db-password}
      token: $GCP_TOKEN
    G2:
      gcp_secret_manager: {name: api-key, version: 3}
      token: $AZURE_TOKEN
      file: false
    AZ:
      azure_key_vault: {name: cert}
    AW1:
      aws_secrets_manager: prod/db#password
    AW2:
      aws_secrets_manager:
        secret_id: prod/api
        version_stage: AWSPREVIOUS
        region: us-east-1
      token: $GCP_TOKEN
`
	e.pushFiles(t, "acme/app", "main", map[string]string{".gitlab-ci.yml": cfg})
	tok := e.createRunner(restapi.CreateRunnerRequest{RunUntagged: boolPtr(true)})
	job := e.takeWait(tok)
	var got any
	if err := json.Unmarshal(job.Secrets, &got); err != nil {
		t.Fatalf("secrets %s: %v", job.Secrets, err)
	}
	const want = `{
	  "G1": {"gcp_secret_manager": {"name": "db-password", "version": "latest",
	      "server": {"project_number": "1234", "workload_identity_federation_pool_id": "pool",
	                 "workload_identity_federation_provider_id": "provider", "jwt": "$GCP_TOKEN"}},
	    "token": "$GCP_TOKEN"},
	  "G2": {"gcp_secret_manager": {"name": "api-key", "version": "3",
	      "server": {"project_number": "1234", "workload_identity_federation_pool_id": "pool",
	                 "workload_identity_federation_provider_id": "provider", "jwt": "$AZURE_TOKEN"}},
	    "token": "$AZURE_TOKEN", "file": false},
	  "AZ": {"azure_key_vault": {"name": "cert", "version": null,
	      "server": {"url": "https://kv.example.net", "client_id": "client", "tenant_id": "tenant", "jwt": "$GCP_TOKEN"}}},
	  "AW1": {"aws_secrets_manager": {"secret_id": "prod/db", "field": "password", "version_id": null, "version_stage": null,
	      "region": null, "role_arn": null, "role_session_name": null,
	      "server": {"region": "eu-west-1", "jwt": "$AWS_ID_TOKEN", "role_arn": "arn:aws:iam::1:role/ci", "role_session_name": null}}},
	  "AW2": {"aws_secrets_manager": {"secret_id": "prod/api", "field": null, "version_id": null, "version_stage": "AWSPREVIOUS",
	      "region": "us-east-1", "role_arn": null, "role_session_name": null,
	      "server": {"region": "eu-west-1", "jwt": "$GCP_TOKEN", "role_arn": "arn:aws:iam::1:role/ci", "role_session_name": null}},
	    "token": "$GCP_TOKEN"}
	}`
	var wantV any
	if err := json.Unmarshal([]byte(want), &wantV); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, wantV) {
		t.Errorf("secrets = %s\nwant %s", job.Secrets, want)
	}
}

// A job whose secrets' provider its variables do not configure is failed
// at hand-out with secrets_provider_not_found (GitLab's pre-assign check),
// not handed out, and the runner's next request gets the next job.
func TestSecretsProviderNotFound(t *testing.T) {
	e := newGitEnv(t, Config{})
	e.createProject(t, "acme/app")
	const cfg = `
variables:
  GCP_PROJECT_NUMBER: "1234"
  GCP_WORKLOAD_IDENTITY_FEDERATION_POOL_ID: pool
  GCP_WORKLOAD_IDENTITY_FEDERATION_PROVIDER_ID: " "
vault:
  script: [a]
  id_tokens: {T: {aud: a}}
  secrets:
    S: {vault: a/b@kv}
gcp:
  script: [b]
  id_tokens: {T: {aud: a}}
  secrets:
    S: {gcp_secret_manager: {name: x}, token: $T}
aws:
  script: [c]
  secrets:
    S: {aws_secrets_manager: x}
noid:
  script: [e]
  variables: {VAULT_SERVER_URL: "https://vault.example.com"}
  secrets:
    S: {vault: a/b@kv}
plain:
  script: [d]
`
	e.pushFiles(t, "acme/app", "main", map[string]string{".gitlab-ci.yml": cfg})
	ps, err := e.st.ListPipelines(t.Context(), store.PipelineFilter{})
	if err != nil || len(ps) != 1 {
		t.Fatalf("pipelines %v, %v", ps, err)
	}
	tok := e.createRunner(restapi.CreateRunnerRequest{RunUntagged: boolPtr(true)})
	job := e.takeWait(tok)
	if job.JobInfo.Name != "plain" {
		t.Errorf("handed out %s, want plain (the others have no secrets provider)", job.JobInfo.Name)
	}
	for name, provider := range map[string]string{"vault": "VAULT_SERVER_URL", "gcp": "GCP_WORKLOAD_IDENTITY_FEDERATION_PROVIDER_ID", "aws": "AWS_REGION"} {
		j := e.latestJob(t, ps[0].ID, name)
		if log := e.trace(t, j.ID); j.Status != store.StatusFailed || j.FailureReason != "secrets_provider_not_found" ||
			!strings.Contains(log, "the secrets provider can not be found") || !strings.Contains(log, provider) {
			t.Errorf("%s: %s %s %q, want failed (secrets_provider_not_found) naming %s", name, j.Status, j.FailureReason, log, provider)
		}
	}
	// No ID token to log in with (GitLab accepts the file; its
	// CI_JOB_JWT fallback is gone): failed, not handed out again.
	if j := e.latestJob(t, ps[0].ID, "noid"); j.Status != store.StatusFailed || j.FailureReason != "unmet_prerequisites" ||
		!strings.Contains(e.trace(t, j.ID), "no ID token to log in to vault with") {
		t.Errorf("noid: %s %s %q, want failed (unmet_prerequisites)", j.Status, j.FailureReason, e.trace(t, j.ID))
	}
	expectCode(t, "finish", e.update(job, runnerapi.UpdateJobRequest{State: "success"}), http.StatusOK)
	waitPipeline(t, e, ps[0].ID, "failed", func(st pipelines.PipelineState) bool { return st.Pipeline.Status == store.StatusFailed })
}
