package runnerapi

// The payload's secrets field (gitlab-protocol.md §2), in the shapes
// GitLab writes (EE Ci::BuildRunnerPresenter#secrets_configuration) and
// gitlab-runner reads (common/spec Secrets). Only the vault provider has a
// type here: Berth's coordinator sends no other, and Berth's runner reads
// the field as raw JSON so that it can name a provider it does not resolve.

// Secrets maps a variable name to the secret that fills it.
type Secrets map[string]Secret

// Secret is one entry of secrets. File is absent unless the job set it
// (absent means a file variable); Token is the job's secrets:token (an
// ID token variable like "$VAULT_ID_TOKEN"), absent unless set.
type Secret struct {
	Vault *VaultSecret `json:"vault,omitempty"`
	File  *bool        `json:"file,omitempty"`
	Token string       `json:"token,omitempty"`
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
