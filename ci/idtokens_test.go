package ci

import (
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/runnerapi"
)

func TestIDTokensForms(t *testing.T) {
	p := mustCompile(t, `
default:
  id_tokens:
    DEFAULT_TOKEN:
      aud: https://default.example
one:
  script: x
  id_tokens:
    FIRST:
      aud: https://vault.example.com
    SECOND:
      aud: [https://a.example, $CI_SERVER_URL]
    SINGLE_LIST:
      aud: [only]
inherits:
  script: x
opts_out:
  script: x
  inherit:
    default: false
`, Env{})
	eq(t, "one id_tokens", jobOf(t, p, "one").IDTokens, []IDToken{
		{Name: "FIRST", Aud: []string{"https://vault.example.com"}},
		{Name: "SECOND", Aud: []string{"https://a.example", "$CI_SERVER_URL"}, AudList: true},
		{Name: "SINGLE_LIST", Aud: []string{"only"}, AudList: true},
	})
	eq(t, "inherited id_tokens", jobOf(t, p, "inherits").IDTokens, []IDToken{{Name: "DEFAULT_TOKEN", Aud: []string{"https://default.example"}}})
	eq(t, "inherit default false", jobOf(t, p, "opts_out").IDTokens, []IDToken(nil))

	payload, err := jobOf(t, p, "one").RunnerPayload(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "payload id tokens", len(payload.IDTokens), 3)
}

func TestSecretsForms(t *testing.T) {
	p := mustCompile(t, `
j:
  script: x
  id_tokens:
    VAULT_ID_TOKEN:
      aud: https://vault.example.com
  secrets:
    SHORT:
      vault: production/db/password
    SHORT_ENGINE:
      vault: production/db/password@ops
      file: false
    FIELD_ONLY:
      vault: password
    AT_FIRST:
      vault: "@x/y"
    LONG:
      vault:
        engine: {name: kv-v1, path: secret}
        path: ci/db
        field: user
      token: $VAULT_ID_TOKEN
      file: true
`, Env{})
	f, tr := false, true
	eq(t, "secrets", jobOf(t, p, "j").Secrets, []Secret{
		{Name: "SHORT", EngineName: "kv-v2", EnginePath: "kv-v2", Path: "production/db", Field: "password"},
		{Name: "SHORT_ENGINE", EngineName: "kv-v2", EnginePath: "ops", Path: "production/db", Field: "password", File: &f},
		{Name: "FIELD_ONLY", EngineName: "kv-v2", EnginePath: "kv-v2", Path: "", Field: "password"},
		// GitLab's rpartition: an @ at the start leaves the whole string
		// as path and field.
		{Name: "AT_FIRST", EngineName: "kv-v2", EnginePath: "kv-v2", Path: "@x", Field: "y"},
		{Name: "LONG", EngineName: "kv-v1", EnginePath: "secret", Path: "ci/db", Field: "user", File: &tr, Token: "$VAULT_ID_TOKEN"},
	})
	payload, err := jobOf(t, p, "j").RunnerPayload(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "payload secret LONG", payload.Secrets["LONG"], runnerapi.Secret{
		Vault: &runnerapi.VaultSecret{Engine: runnerapi.VaultEngine{Name: "kv-v1", Path: "secret"}, Path: "ci/db", Field: "user"},
		File:  &tr, Token: "$VAULT_ID_TOKEN",
	})
	eq(t, "payload secrets", len(payload.Secrets), 5)
	if !payload.Secrets["SHORT"].IsFile() || payload.Secrets["SHORT_ENGINE"].IsFile() {
		t.Errorf("file defaults: SHORT file=%v (want true), SHORT_ENGINE file=%v (want false)",
			payload.Secrets["SHORT"].IsFile(), payload.Secrets["SHORT_ENGINE"].IsFile())
	}
}

// The cloud secret managers, as GitLab's entries read them.
func TestCloudSecretForms(t *testing.T) {
	p := mustCompile(t, `
j:
  script: x
  id_tokens:
    GCP_TOKEN: {aud: gcp}
  secrets:
    GCP:
      gcp_secret_manager: {name: db}
      token: $GCP_TOKEN
    GCP_V:
      gcp_secret_manager: {name: db, version: 7}
      token: $GCP_TOKEN
      file: null
    AZ:
      azure_key_vault: {name: cert, version: abc}
    AWS_ID:
      aws_secrets_manager: prod/db
    AWS_FIELD:
      aws_secrets_manager: prod/db#user
    AWS_EMPTY_FIELD:
      aws_secrets_manager: "prod/db#"
    AWS_HASH:
      aws_secrets_manager: {secret_id: prod/api, version_id: v1, region: null, role_session_name: ci}
      token: null
`, Env{})
	str := func(s string) *string { return &s }
	eq(t, "secrets", jobOf(t, p, "j").Secrets, []Secret{
		{Name: "GCP", GCP: &runnerapi.GCPSecretManagerSecret{Name: "db", Version: "latest"}, Token: "$GCP_TOKEN"},
		{Name: "GCP_V", GCP: &runnerapi.GCPSecretManagerSecret{Name: "db", Version: "7"}, Token: "$GCP_TOKEN"},
		{Name: "AZ", Azure: &runnerapi.AzureKeyVaultSecret{Name: "cert", Version: str("abc")}},
		{Name: "AWS_ID", AWS: &runnerapi.AWSSecretsManagerSecret{SecretID: "prod/db"}},
		{Name: "AWS_FIELD", AWS: &runnerapi.AWSSecretsManagerSecret{SecretID: "prod/db", Field: str("user")}},
		// Ruby's split drops the empty part after a trailing '#'.
		{Name: "AWS_EMPTY_FIELD", AWS: &runnerapi.AWSSecretsManagerSecret{SecretID: "prod/db"}},
		{Name: "AWS_HASH", AWS: &runnerapi.AWSSecretsManagerSecret{SecretID: "prod/api", VersionID: str("v1"), RoleSessionName: str("ci")}},
	})
	payload, err := jobOf(t, p, "j").RunnerPayload(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	eq(t, "payload gcp", payload.Secrets["GCP_V"], runnerapi.Secret{
		GCPSecretManager: &runnerapi.GCPSecretManagerSecret{Name: "db", Version: "7"}, Token: "$GCP_TOKEN"})
	eq(t, "payload azure", payload.Secrets["AZ"], runnerapi.Secret{
		AzureKeyVault: &runnerapi.AzureKeyVaultSecret{Name: "cert", Version: str("abc")}})
	eq(t, "payload aws", payload.Secrets["AWS_FIELD"], runnerapi.Secret{
		AWSSecretsManager: &runnerapi.AWSSecretsManagerSecret{SecretID: "prod/db", Field: str("user")}})
}

func TestIDTokensAndSecretsErrors(t *testing.T) {
	const tok = "  id_tokens:\n    T:\n      aud: a\n"
	tests := []struct {
		name, yml, want string
	}{
		{"id_tokens not a mapping", "j:\n  script: x\n  id_tokens: [a]\n", "jobs:j:id_tokens should be a mapping"},
		{"token not a mapping", "j:\n  script: x\n  id_tokens:\n    T: https://x\n", "jobs:j:id_tokens:T should be a mapping"},
		{"aud missing", "j:\n  script: x\n  id_tokens:\n    T: {}\n", "jobs:j:id_tokens:T config missing required keys: aud"},
		{"aud null", "j:\n  script: x\n  id_tokens:\n    T:\n      aud:\n", "jobs:j:id_tokens:T:aud should be a string or a list of strings"},
		{"aud a mapping", "j:\n  script: x\n  id_tokens:\n    T:\n      aud: {a: b}\n", "jobs:j:id_tokens:T:aud should be a string or a list of strings"},
		{"aud list of non-strings", "j:\n  script: x\n  id_tokens:\n    T:\n      aud: [a, [b]]\n", "jobs:j:id_tokens:T:aud should contain only strings"},
		{"aud boolean", "j:\n  script: x\n  id_tokens:\n    T:\n      aud: true\n", "jobs:j:id_tokens:T:aud should be a string"},
		{"unknown key", "j:\n  script: x\n  id_tokens:\n    T:\n      aud: a\n      sub: b\n", `jobs:j:id_tokens:T: unknown keyword "sub"`},
		{"default id_tokens checked", "default:\n  id_tokens:\n    T: {}\nj:\n  script: x\n", "default:id_tokens:T config missing required keys: aud"},

		{"secrets not a mapping", "j:\n  script: x\n" + tok + "  secrets: [a]\n", "jobs:j:secrets should be a mapping"},
		{"secret not a mapping", "j:\n  script: x\n" + tok + "  secrets:\n    S: a/b\n", "jobs:j:secrets:S should be a mapping"},
		{"no provider", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      file: true\n", "jobs:j:secrets:S config must use exactly one of these keys: vault, azure_key_vault, gcp_secret_manager, akeyless, gitlab_secrets_manager, aws_secrets_manager"},
		{"two providers", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: a/b\n      azure_key_vault: {name: x}\n", "must use exactly one of these keys"},
		{"akeyless", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      akeyless: {name: x}\n", "jobs:j:secrets:S: Berth supports vault, gcp_secret_manager, azure_key_vault and aws_secrets_manager secrets, not akeyless"},
		{"gitlab secrets manager", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      gitlab_secrets_manager: {name: x}\n", "not gitlab_secrets_manager"},
		{"gcp without token", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      gcp_secret_manager: {name: x}\n", "jobs:j:secrets:S token is required with gcp secrets manager"},
		{"gcp without name", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      gcp_secret_manager: {version: 2}\n      token: $T\n", "jobs:j:secrets:S:gcp_secret_manager: name can't be blank"},
		{"gcp version a list", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      gcp_secret_manager: {name: x, version: [1]}\n      token: $T\n", "jobs:j:secrets:S:gcp_secret_manager:version should be alphanumeric"},
		{"gcp unknown key", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      gcp_secret_manager: {name: x, project: p}\n      token: $T\n", `jobs:j:secrets:S:gcp_secret_manager: unknown keyword "project"`},
		{"gcp a string", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      gcp_secret_manager: x\n      token: $T\n", "jobs:j:secrets:S:gcp_secret_manager should be a mapping"},
		{"azure without name", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      azure_key_vault: {}\n", "jobs:j:secrets:S:azure_key_vault: name can't be blank"},
		{"azure version not a string", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      azure_key_vault: {name: x, version: [a]}\n", "jobs:j:secrets:S:azure_key_vault:version should be a string"},
		{"aws two fields", "j:\n  script: x\n  secrets:\n    S:\n      aws_secrets_manager: 'a#b#c'\n", "jobs:j:secrets:S:aws_secrets_manager must contain at most one '#'"},
		{"aws blank", "j:\n  script: x\n  secrets:\n    S:\n      aws_secrets_manager: ''\n", "jobs:j:secrets:S:aws_secrets_manager can't be blank"},
		{"aws without secret_id", "j:\n  script: x\n  secrets:\n    S:\n      aws_secrets_manager: {field: f}\n", "jobs:j:secrets:S:aws_secrets_manager: secret_id can't be blank"},
		{"aws unknown key", "j:\n  script: x\n  secrets:\n    S:\n      aws_secrets_manager: {secret_id: x, kms: k}\n", `jobs:j:secrets:S:aws_secrets_manager: unknown keyword "kms"`},
		{"aws region not a string", "j:\n  script: x\n  secrets:\n    S:\n      aws_secrets_manager: {secret_id: x, region: [a]}\n", "jobs:j:secrets:S:aws_secrets_manager:region should be a string"},
		{"aws a list", "j:\n  script: x\n  secrets:\n    S:\n      aws_secrets_manager: [x]\n", "jobs:j:secrets:S:aws_secrets_manager should be a hash or a string"},
		{"unknown secret key", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: a/b\n      strategy: read\n", `jobs:j:secrets:S: unknown keyword "strategy"`},
		{"vault blank", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: ''\n", "jobs:j:secrets:S:vault can't be blank"},
		{"vault a list", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: [a]\n", "jobs:j:secrets:S:vault should be a hash or a string"},
		{"vault a boolean", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: true\n", "jobs:j:secrets:S:vault should be a hash or a string"},
		{"vault path missing", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: {engine: {name: kv-v2, path: kv}, field: f}\n", "jobs:j:secrets:S:vault: path can't be blank"},
		{"vault field missing", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: {engine: {name: kv-v2, path: kv}, path: p}\n", "jobs:j:secrets:S:vault: field can't be blank"},
		{"vault engine missing", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: {path: p, field: f}\n", "jobs:j:secrets:S:vault: engine can't be blank"},
		{"vault engine a string", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: {engine: kv-v2, path: p, field: f}\n", "jobs:j:secrets:S:vault:engine should be a mapping"},
		{"vault engine name missing", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: {engine: {path: kv}, path: p, field: f}\n", "jobs:j:secrets:S:vault:engine: name can't be blank"},
		{"vault engine path blank", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: {engine: {name: kv-v2, path: ''}, path: p, field: f}\n", "jobs:j:secrets:S:vault:engine:path can't be blank"},
		{"vault engine unknown key", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: {engine: {name: kv-v2, path: kv, version: 2}, path: p, field: f}\n", `jobs:j:secrets:S:vault:engine: unknown keyword "version"`},
		{"vault unknown key", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: {engine: {name: kv-v2, path: kv}, path: p, field: f, fields: [a]}\n", `jobs:j:secrets:S:vault: unknown keyword "fields"`},
		{"vault path not a string", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: {engine: {name: kv-v2, path: kv}, path: [p], field: f}\n", "jobs:j:secrets:S:vault:path should be a string"},
		{"file not a boolean", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: a/b\n      file: yes please\n", "jobs:j:secrets:S:file should be a boolean"},
		{"token not a string", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      vault: a/b\n      token: [a]\n", "jobs:j:secrets:S:token should be a string"},
		{"secrets in default", "default:\n  secrets:\n    S:\n      vault: a/b\nj:\n  script: x\n", `default: unknown keyword "secrets"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := compileErrors(t, tt.yml, Env{})
			if !strings.Contains(strings.Join(errs, "\n"), tt.want) {
				t.Errorf("errors %q\nwant one containing %q", errs, tt.want)
			}
		})
	}
}

// A secret without token and an ID token from default: is valid: GitLab
// logs in with the job's first ID token.
func TestSecretsWithDefaultIDToken(t *testing.T) {
	p := mustCompile(t, "default:\n  id_tokens:\n    T:\n      aud: a\nj:\n  script: x\n  secrets:\n    S:\n      vault: a/b\n", Env{})
	eq(t, "secrets", len(jobOf(t, p, "j").Secrets), 1)
}

// Vault and Azure secrets without an ID token to log in with: GitLab
// accepts the file (its CI_JOB_JWT fallback is gone), so Berth warns; the
// job fails when handed out.
func TestSecretsWithoutIDTokensWarn(t *testing.T) {
	for _, yml := range []string{
		"j:\n  script: x\n  secrets:\n    S:\n      vault: a/b\n",
		"j:\n  script: x\n  secrets:\n    S:\n      azure_key_vault: {name: x}\n",
	} {
		p := mustCompile(t, yml, Env{})
		var got []string
		for _, w := range p.Warnings {
			got = append(got, w.Msg)
		}
		if !strings.Contains(strings.Join(got, "\n"), "jobs:j:secrets: vault and azure_key_vault secrets log in with an ID token: define one in id_tokens") {
			t.Errorf("%q: warnings %q", yml, got)
		}
	}
}
