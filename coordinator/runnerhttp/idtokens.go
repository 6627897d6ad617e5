package runnerhttp

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// OIDC ID tokens (the id_tokens keyword) and the payload's secrets field:
// claims as GitLab's Gitlab::Ci::JwtV2, keys in coordinator/idtoken,
// discovery and JWKS where GitLab serves them. docs/ci-yaml.md "ID tokens
// and secrets" lists the claims Berth leaves out and why.

// idTokenNotBefore is how far before iat a token becomes valid
// (GitLab's Jwt::NOT_BEFORE_TIME).
const idTokenNotBefore = 5 * time.Second

// defaultIDTokenTTL is the lifetime of a token of a job without a
// timeout (GitLab's Jwt::DEFAULT_EXPIRE_TIME).
const defaultIDTokenTTL = 5 * time.Minute

// idTokenClaims are the claims of an ID token, GitLab's names and types:
// ids are strings except runner_id; absent ones are left out.
type idTokenClaims struct {
	NamespaceID          string `json:"namespace_id,omitempty"`
	NamespacePath        string `json:"namespace_path,omitempty"`
	ProjectID            string `json:"project_id"`
	ProjectPath          string `json:"project_path,omitempty"`
	JobNamespaceID       string `json:"job_namespace_id,omitempty"`
	JobNamespacePath     string `json:"job_namespace_path,omitempty"`
	JobProjectID         string `json:"job_project_id"`
	JobProjectPath       string `json:"job_project_path,omitempty"`
	PipelineID           string `json:"pipeline_id,omitempty"`
	PipelineSource       string `json:"pipeline_source,omitempty"`
	JobID                string `json:"job_id"`
	Ref                  string `json:"ref,omitempty"`
	RefType              string `json:"ref_type,omitempty"`
	RefPath              string `json:"ref_path,omitempty"`
	RefProtected         string `json:"ref_protected"`
	Environment          string `json:"environment,omitempty"`
	EnvironmentProtected string `json:"environment_protected,omitempty"`
	DeploymentTier       string `json:"deployment_tier,omitempty"`
	EnvironmentAction    string `json:"environment_action,omitempty"`
	RunnerID             int64  `json:"runner_id"`
	RunnerEnvironment    string `json:"runner_environment"`
	Sha                  string `json:"sha,omitempty"`
	ProjectVisibility    string `json:"project_visibility,omitempty"`
	CIConfigRefURI       string `json:"ci_config_ref_uri,omitempty"`
	CIConfigSha          string `json:"ci_config_sha,omitempty"`

	JTI string `json:"jti"`
	ISS string `json:"iss"`
	IAT int64  `json:"iat"`
	NBF int64  `json:"nbf"`
	EXP int64  `json:"exp"`
	SUB string `json:"sub"`
	// AUD is a string, or a list when id_tokens:aud was one.
	AUD any `json:"aud"`
}

// idTokenVariables signs the job's ID tokens and returns them as masked
// variables. vars are the job's variables so far (predefined, project,
// pipeline): CI/CD variables in aud are expanded with them, as GitLab
// expands aud with the job's variables.
func (s *API) idTokenVariables(ctx context.Context, j *store.Job, spec *dispatch.JobSpec, rn *store.Runner, vars []runnerapi.Variable, timeout int, now time.Time) ([]runnerapi.Variable, error) {
	if len(spec.IDTokens) == 0 {
		return nil, nil
	}
	base := s.claimsFor(ctx, j, spec, rn, timeout, now)
	lookup := dispatch.ExpandVariables(vars)
	var out []runnerapi.Variable
	for _, t := range spec.IDTokens {
		c := base
		jti, err := uuid4()
		if err != nil {
			return nil, err
		}
		c.JTI = jti
		aud := make([]string, len(t.Aud))
		for i, a := range t.Aud {
			aud[i] = dispatch.ExpandString(a, lookup)
		}
		if t.AudList {
			c.AUD = aud
		} else if len(aud) > 0 {
			c.AUD = aud[0]
		}
		payload, err := json.Marshal(c)
		if err != nil {
			return nil, err
		}
		tok, err := s.idKeys.Sign(payload)
		if err != nil {
			return nil, fmt.Errorf("ID token %s of job %d: %w", t.Name, j.ID, err)
		}
		out = append(out, runnerapi.Variable{Key: t.Name, Value: tok, Masked: true})
	}
	return out, nil
}

// claimsFor builds the claims every ID token of a hand-out shares.
func (s *API) claimsFor(ctx context.Context, j *store.Job, spec *dispatch.JobSpec, rn *store.Runner, timeout int, now time.Time) idTokenClaims {
	ttl := time.Duration(timeout) * time.Second
	if ttl <= 0 {
		ttl = defaultIDTokenTTL
	}
	projectPath := spec.ProjectFullPath
	visibility := ""
	if p, err := s.store.GetProject(ctx, j.ProjectID); err == nil {
		projectPath, visibility = p.Path, p.Visibility
	}
	c := idTokenClaims{
		ProjectID: strconv.FormatInt(j.ProjectID, 10), ProjectPath: projectPath,
		JobID: strconv.FormatInt(j.ID, 10), RefProtected: strconv.FormatBool(spec.Protected),
		PipelineSource: spec.PipelineSource,
		RunnerID:       rn.ID, RunnerEnvironment: "self-hosted",
		Sha: spec.Sha, ProjectVisibility: visibility,
		ISS: s.baseURL, IAT: now.Unix(), NBF: now.Add(-idTokenNotBefore).Unix(), EXP: now.Add(ttl).Unix(),
	}
	if i := strings.LastIndexByte(projectPath, '/'); i > 0 {
		c.NamespacePath = projectPath[:i]
	}
	if spec.NamespaceID > 0 {
		c.NamespaceID = strconv.FormatInt(spec.NamespaceID, 10)
	}
	// Berth has no forks: the job's project is the pipeline's.
	c.JobNamespaceID, c.JobNamespacePath, c.JobProjectID, c.JobProjectPath = c.NamespaceID, c.NamespacePath, c.ProjectID, c.ProjectPath
	if j.PipelineID > 0 {
		c.PipelineID = strconv.FormatInt(j.PipelineID, 10)
	}
	if spec.Ref != "" {
		c.Ref, c.RefType = spec.Ref, spec.RefType
		if c.RefType == "" {
			c.RefType = "branch"
		}
		c.RefPath = "refs/heads/" + spec.Ref
		if c.RefType == "tag" {
			c.RefPath = "refs/tags/" + spec.Ref
		}
	}
	var sub []string
	for _, kv := range [][2]string{{"project_path", projectPath}, {"ref_type", c.RefType}, {"ref", c.Ref}} {
		if kv[1] != "" {
			sub = append(sub, kv[0], kv[1])
		}
	}
	c.SUB = strings.Join(sub, ":")
	// The environment as the pipeline created it: name expanded, tier
	// given or guessed (pipelines/deploy.go).
	if e := graph.Decode(j.Graph).Env; e != nil && e.Name != "" {
		c.Environment = e.Name
		c.EnvironmentProtected = "false" // Berth has no protected environments
		c.DeploymentTier = e.Tier
		c.EnvironmentAction = e.Action
		if c.EnvironmentAction == "" {
			c.EnvironmentAction = "start"
		}
	}
	if spec.CIConfigPath != "" && projectPath != "" && c.RefPath != "" {
		host := s.baseURL
		if u, err := url.Parse(host); err == nil {
			host = u.Host
		}
		c.CIConfigRefURI = host + "/" + projectPath + "//" + spec.CIConfigPath + "@" + c.RefPath
		c.CIConfigSha = spec.Sha
	}
	return c
}

// uuid4 is a random RFC 4122 UUID, the jti of a token (GitLab:
// SecureRandom.uuid).
func uuid4() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

// payloadSecrets is the payload's secrets field: the job's secrets with
// the server GitLab fills from the job's variables (raw values; the runner
// expands them), as EE Ci::BuildRunnerPresenter does — each secret's own,
// where GitLab gives every secret of a provider the first one's token. A
// secret whose provider the variables do not configure fails the job
// with secrets_provider_not_found (GitLab's pre-assign check,
// Ci::Secrets::Integration).
func payloadSecrets(spec *dispatch.JobSpec, vars []runnerapi.Variable) (json.RawMessage, error) {
	if len(spec.Secrets) == 0 {
		return nil, nil
	}
	value := func(k string) *string {
		var out *string
		for _, v := range vars {
			if v.Key == k {
				val := v.Value
				out = &val
			}
		}
		return out
	}
	present := func(keys ...string) bool {
		for _, k := range keys {
			if v := value(k); v == nil || strings.TrimSpace(*v) == "" {
				return false
			}
		}
		return true
	}
	// idToken is the login token of a vault or azure secret: its own, else
	// the job's first ID token.
	idToken := func(name string, sec runnerapi.Secret) (string, error) {
		if sec.Token != "" {
			return sec.Token, nil
		}
		if len(spec.IDTokens) == 0 {
			return "", &dropError{reason: runnerapi.UnmetPrerequisites,
				msg: fmt.Sprintf("secret %s: no ID token to log in to %s with: define one in id_tokens", name, sec.Provider())}
		}
		return "$" + spec.IDTokens[0].Name, nil
	}
	out := runnerapi.Secrets{}
	for _, name := range slices.Sorted(maps.Keys(spec.Secrets)) {
		sec := spec.Secrets[name]
		provider := sec.Provider()
		if !present(secretsProviderVariables[provider]...) {
			return nil, &dropError{reason: runnerapi.SecretsProviderNotFound,
				msg: fmt.Sprintf("the secrets provider can not be found: secret %s uses %s, which needs the CI/CD variables %s",
					name, provider, strings.Join(secretsProviderVariables[provider], ", "))}
		}
		switch provider {
		case "vault":
			jwt, err := idToken(name, sec)
			if err != nil {
				return nil, err
			}
			authPath := "jwt"
			if p := value("VAULT_AUTH_PATH"); p != nil {
				authPath = *p
			}
			v := *sec.Vault
			v.Server = &runnerapi.VaultServer{
				URL:       value("VAULT_SERVER_URL"),
				Namespace: value("VAULT_NAMESPACE"),
				Auth:      runnerapi.VaultAuth{Name: "jwt", Path: authPath, Data: runnerapi.VaultAuthData{JWT: jwt, Role: value("VAULT_AUTH_ROLE")}},
			}
			sec.Vault = &v
		case "gcp_secret_manager":
			g := *sec.GCPSecretManager
			g.Server = &runnerapi.GCPSecretManagerServer{
				ProjectNumber:                        value("GCP_PROJECT_NUMBER"),
				WorkloadIdentityFederationPoolID:     value("GCP_WORKLOAD_IDENTITY_FEDERATION_POOL_ID"),
				WorkloadIdentityFederationProviderID: value("GCP_WORKLOAD_IDENTITY_FEDERATION_PROVIDER_ID"),
				JWT:                                  sec.Token,
			}
			sec.GCPSecretManager = &g
		case "azure_key_vault":
			jwt, err := idToken(name, sec)
			if err != nil {
				return nil, err
			}
			a := *sec.AzureKeyVault
			a.Server = &runnerapi.AzureKeyVaultServer{URL: value("AZURE_KEY_VAULT_SERVER_URL"),
				ClientID: value("AZURE_CLIENT_ID"), TenantID: value("AZURE_TENANT_ID"), JWT: jwt}
			sec.AzureKeyVault = &a
		case "aws_secrets_manager":
			jwt := sec.Token
			if jwt == "" {
				jwt = "$AWS_ID_TOKEN"
			}
			a := *sec.AWSSecretsManager
			a.Server = &runnerapi.AWSSecretsManagerServer{Region: value("AWS_REGION"), JWT: jwt,
				RoleARN: value("AWS_ROLE_ARN"), RoleSessionName: value("AWS_ROLE_SESSION_NAME")}
			sec.AWSSecretsManager = &a
		default:
			return nil, fmt.Errorf("secret %s has no provider", name)
		}
		out[name] = sec
	}
	return json.Marshal(out)
}

// secretsProviderVariables are the CI/CD variables that configure each
// secrets provider for a job (GitLab's Ci::Secrets::Integration).
var secretsProviderVariables = map[string][]string{
	"vault":               {"VAULT_SERVER_URL"},
	"gcp_secret_manager":  {"GCP_PROJECT_NUMBER", "GCP_WORKLOAD_IDENTITY_FEDERATION_POOL_ID", "GCP_WORKLOAD_IDENTITY_FEDERATION_PROVIDER_ID"},
	"azure_key_vault":     {"AZURE_KEY_VAULT_SERVER_URL", "AZURE_CLIENT_ID", "AZURE_TENANT_ID"},
	"aws_secrets_manager": {"AWS_REGION"},
}

// openIDConfiguration is the discovery document: what an OIDC relying
// party (Vault's JWT auth with oidc_discovery_url, cloud identity
// federation) needs to verify ID tokens. Berth is no OAuth provider: no
// authorization or token endpoints are claimed.
type openIDConfiguration struct {
	Issuer                           string   `json:"issuer"`
	JWKSURI                          string   `json:"jwks_uri"`
	ResponseTypesSupported           []string `json:"response_types_supported"`
	SubjectTypesSupported            []string `json:"subject_types_supported"`
	IDTokenSigningAlgValuesSupported []string `json:"id_token_signing_alg_values_supported"`
	ScopesSupported                  []string `json:"scopes_supported"`
	ClaimsSupported                  []string `json:"claims_supported"`
}

// claimNames are the claims a Berth ID token may carry.
var claimNames = []string{"iss", "sub", "aud", "exp", "nbf", "iat", "jti",
	"namespace_id", "namespace_path", "project_id", "project_path",
	"job_namespace_id", "job_namespace_path", "job_project_id", "job_project_path",
	"pipeline_id", "pipeline_source", "job_id", "ref", "ref_type", "ref_path", "ref_protected",
	"environment", "environment_protected", "deployment_tier", "environment_action",
	"runner_id", "runner_environment", "sha", "project_visibility", "ci_config_ref_uri", "ci_config_sha"}

// handleOpenIDConfiguration: GET /.well-known/openid-configuration,
// unauthenticated as GitLab's.
func (s *API) handleOpenIDConfiguration(w http.ResponseWriter, r *http.Request) {
	iss := s.baseURL
	httpapi.WriteJSON(w, http.StatusOK, openIDConfiguration{
		Issuer: iss, JWKSURI: iss + "/oauth/discovery/keys",
		ResponseTypesSupported: []string{"id_token"}, SubjectTypesSupported: []string{"public"},
		IDTokenSigningAlgValuesSupported: []string{"RS256"}, ScopesSupported: []string{"openid"},
		ClaimsSupported: claimNames,
	})
}

// handleJWKS: GET /oauth/discovery/keys (and GitLab's alias /-/jwks),
// unauthenticated: every key that verifies, the signing one first.
func (s *API) handleJWKS(w http.ResponseWriter, r *http.Request) {
	set, err := s.idKeys.JWKS()
	if err != nil {
		httpapi.InternalError(s.log, w, "loading ID token keys", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, set)
}
