package runnerapi

// The payload's secrets field (gitlab-protocol.md §2), in the shapes
// GitLab writes (EE Ci::BuildRunnerPresenter#secrets_configuration) and
// gitlab-runner reads (common/spec Secrets): vault, and the cloud secret
// managers gitlab-runner resolves itself (GCP Secret Manager, Azure Key
// Vault, AWS Secrets Manager). Berth's runner resolves vault and reads the
// field as raw JSON so that it can name a provider it does not resolve.

// Secrets maps a variable name to the secret that fills it.
type Secrets map[string]Secret

// Secret is one entry of secrets. File is absent unless the job set it
// (absent means a file variable); Token is the job's secrets:token (an
// ID token variable like "$VAULT_ID_TOKEN"), absent unless set.
type Secret struct {
	Vault             *VaultSecret             `json:"vault,omitempty"`
	GCPSecretManager  *GCPSecretManagerSecret  `json:"gcp_secret_manager,omitempty"`
	AzureKeyVault     *AzureKeyVaultSecret     `json:"azure_key_vault,omitempty"`
	AWSSecretsManager *AWSSecretsManagerSecret `json:"aws_secrets_manager,omitempty"`
	File              *bool                    `json:"file,omitempty"`
	Token             string                   `json:"token,omitempty"`
}

// Provider is the name of the secret's provider (its key in the payload),
// or "" when it has none of these.
func (s Secret) Provider() string {
	switch {
	case s.Vault != nil:
		return "vault"
	case s.GCPSecretManager != nil:
		return "gcp_secret_manager"
	case s.AzureKeyVault != nil:
		return "azure_key_vault"
	case s.AWSSecretsManager != nil:
		return "aws_secrets_manager"
	}
	return ""
}

// IsFile is whether the secret becomes a file variable: true unless the
// job said file: false (gitlab-runner's Secret.IsFile).
func (s Secret) IsFile() bool { return s.File == nil || *s.File }

// VaultSecret names a field of a secret in a Vault KV engine. Server is
// filled by the coordinator at hand-out from the job's VAULT_* variables.
type VaultSecret struct {
	Engine VaultEngine  `json:"engine"`
	Path   string       `json:"path"`
	Field  string       `json:"field"`
	Server *VaultServer `json:"server,omitempty"`
}

// VaultEngine is the secrets engine: name kv-v2, kv-v1 or generic, and
// the path it is mounted at.
type VaultEngine struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// VaultServer is how to reach and log in to Vault. URL and Namespace are
// null when the job has no VAULT_SERVER_URL or VAULT_NAMESPACE variable,
// as GitLab sends them.
type VaultServer struct {
	URL       *string   `json:"url"`
	Auth      VaultAuth `json:"auth"`
	Namespace *string   `json:"namespace"`
}

// VaultAuth is the auth method: name "jwt", mounted at Path (the job's
// VAULT_AUTH_PATH, default "jwt"), logged in to with Data.
type VaultAuth struct {
	Name string        `json:"name"`
	Path string        `json:"path"`
	Data VaultAuthData `json:"data"`
}

// VaultAuthData is the login body: jwt (a variable reference the runner
// expands, like "$VAULT_ID_TOKEN") and role (absent without a
// VAULT_AUTH_ROLE variable: Vault then uses the method's default role).
type VaultAuthData struct {
	JWT  string  `json:"jwt"`
	Role *string `json:"role,omitempty"`
}

// GCPSecretManagerSecret is a version of a secret in Google Cloud's Secret
// Manager, read with a workload identity federation token exchange.
// Server is filled by the coordinator from the job's GCP_* variables.
type GCPSecretManagerSecret struct {
	Name    string                  `json:"name"`
	Version string                  `json:"version"`
	Server  *GCPSecretManagerServer `json:"server,omitempty"`
}

// GCPSecretManagerServer is the federation the runner exchanges the job's
// ID token (JWT, a variable reference) with. A field is null when its
// variable is not set, as GitLab sends it.
type GCPSecretManagerServer struct {
	ProjectNumber                        *string `json:"project_number"`
	WorkloadIdentityFederationPoolID     *string `json:"workload_identity_federation_pool_id"`
	WorkloadIdentityFederationProviderID *string `json:"workload_identity_federation_provider_id"`
	JWT                                  string  `json:"jwt"`
}

// AzureKeyVaultSecret is a secret in an Azure Key Vault; Version absent
// (null) means the current one. Server is filled by the coordinator from
// the job's AZURE_* variables.
type AzureKeyVaultSecret struct {
	Name    string               `json:"name"`
	Version *string              `json:"version"`
	Server  *AzureKeyVaultServer `json:"server,omitempty"`
}

// AzureKeyVaultServer is the vault and the app registration the runner
// logs in to with the job's ID token (JWT, a variable reference).
type AzureKeyVaultServer struct {
	URL      *string `json:"url"`
	ClientID *string `json:"client_id"`
	TenantID *string `json:"tenant_id"`
	JWT      string  `json:"jwt"`
}

// AWSSecretsManagerSecret is a secret of AWS Secrets Manager, or one field
// of its JSON value. The optional fields are null when not set, as
// GitLab's entry writes them. Server is filled by the coordinator from the
// job's AWS_* variables.
type AWSSecretsManagerSecret struct {
	SecretID        string                   `json:"secret_id"`
	VersionID       *string                  `json:"version_id"`
	VersionStage    *string                  `json:"version_stage"`
	Region          *string                  `json:"region"`
	RoleARN         *string                  `json:"role_arn"`
	Field           *string                  `json:"field"`
	RoleSessionName *string                  `json:"role_session_name"`
	Server          *AWSSecretsManagerServer `json:"server,omitempty"`
}

// AWSSecretsManagerServer is the region and the role the runner assumes
// with the job's ID token (JWT, a variable reference; $AWS_ID_TOKEN unless
// the secret names another).
type AWSSecretsManagerServer struct {
	Region          *string `json:"region"`
	JWT             string  `json:"jwt"`
	RoleARN         *string `json:"role_arn"`
	RoleSessionName *string `json:"role_session_name"`
}
