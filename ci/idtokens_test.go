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
		{"gcp", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      gcp_secret_manager: {name: x}\n      token: $T\n", "jobs:j:secrets:S:gcp_secret_manager: Berth supports vault secrets only"},
		{"azure", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      azure_key_vault: {name: x}\n", "jobs:j:secrets:S:azure_key_vault: Berth supports vault secrets only"},
		{"aws", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      aws_secrets_manager: {secret_id: x}\n", "jobs:j:secrets:S:aws_secrets_manager: Berth supports vault secrets only"},
		{"akeyless", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      akeyless: {name: x}\n", "jobs:j:secrets:S:akeyless: Berth supports vault secrets only"},
		{"gitlab secrets manager", "j:\n  script: x\n" + tok + "  secrets:\n    S:\n      gitlab_secrets_manager: {name: x}\n", "jobs:j:secrets:S:gitlab_secrets_manager: Berth supports vault secrets only"},
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
		{"secrets without id_tokens", "j:\n  script: x\n  secrets:\n    S:\n      vault: a/b\n", "jobs:j:secrets: vault secrets log in to Vault with an ID token: define one in id_tokens"},
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
