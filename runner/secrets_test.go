package runner

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/berthci/berth/runner/vault/vaulttest"
	"github.com/berthci/berth/runnerapi"
)

// vaultJob is a job whose secrets come from a fake Vault that verifies
// its ID token against an OIDC issuer.
func vaultJob(t *testing.T, id int64, secrets string, script ...string) (*runnerapi.JobResponse, *vaulttest.Server) {
	t.Helper()
	is := vaulttest.NewIssuer()
	t.Cleanup(is.Close)
	v := vaulttest.New()
	t.Cleanup(v.Close)
	v.Issuer = is.URL
	v.Roles["ci"] = vaulttest.Role{BoundAudiences: []string{"https://vault.example"}, Policies: []string{"kv/data/ci/*", "secret/ci/*"}}
	v.KV2["kv"] = map[string]map[string]any{"ci/db": {"password": "pw-kv2-value"}}
	v.KV1["secret"] = map[string]map[string]any{"ci/api": {"key": "key-kv1-value"}}
	jwt, err := is.Sign(map[string]any{"aud": "https://vault.example", "sub": "project_path:group/project"})
	if err != nil {
		t.Fatal(err)
	}
	job := fakeJob(id, script...)
	job.Variables = append(job.Variables,
		runnerapi.Variable{Key: "VAULT_ID_TOKEN", Value: jwt, Masked: true},
		runnerapi.Variable{Key: "VAULT_HOST", Value: strings.TrimPrefix(v.URL, "http://"), Public: true},
		runnerapi.Variable{Key: "KV_MOUNT", Value: "kv", Public: true},
	)
	job.Secrets = json.RawMessage(strings.ReplaceAll(secrets, "VAULT_URL", "http://$VAULT_HOST"))
	return job, v
}

// A server block as GitLab sends it; the runner expands its variables.
const vaultServer = `"server": {"url": "VAULT_URL", "namespace": null, "auth": {"name": "jwt", "path": "jwt", "data": {"jwt": "$VAULT_ID_TOKEN", "role": "ci"}}}`

func TestResolveSecrets(t *testing.T) {
	f := newFake(t)
	job, v := vaultJob(t, 41, `{
	  "DB_PASSWORD": {"vault": {"engine": {"name": "kv-v2", "path": "$KV_MOUNT"}, "path": "ci/db", "field": "password", `+vaultServer+`}},
	  "API_KEY": {"vault": {"engine": {"name": "kv-v1", "path": "secret"}, "path": "ci/api", "field": "key", `+vaultServer+`}, "file": false, "token": "$VAULT_ID_TOKEN"}
	}`,
		`case "$DB_PASSWORD" in /*) echo db-is-a-file;; esac`,
		`test "$(cat "$DB_PASSWORD")" = pw-kv2-value && echo db-file-content-ok`,
		`test "$API_KEY" = key-kv1-value && echo api-env-ok`,
		`echo "leak: $API_KEY $(cat "$DB_PASSWORD")"`,
	)
	_, finals := runOne(t, f, job)
	final := lastFinal(t, finals)
	tr := f.trace(41)
	if final.State != "success" {
		t.Fatalf("final %+v\n%s", final, tr)
	}
	for _, want := range []string{":resolve_secrets\r", "Resolving secrets", `Resolving secret "API_KEY"...`, `Resolving secret "DB_PASSWORD"...`,
		`Using "vault" secret resolver...`, "db-is-a-file", "db-file-content-ok", "api-env-ok", "leak: [MASKED] [MASKED]"} {
		if !strings.Contains(tr, want) {
			t.Errorf("trace lacks %q:\n%s", want, tr)
		}
	}
	if strings.Contains(tr, "pw-kv2-value") || strings.Contains(tr, "key-kv1-value") {
		t.Errorf("secret value in the trace:\n%s", tr)
	}
	// resolve_secrets comes before the executor is prepared.
	if strings.Index(tr, "resolve_secrets") > strings.Index(tr, "prepare_executor") {
		t.Errorf("resolve_secrets after prepare_executor:\n%s", tr)
	}
	if n := len(v.Logins()); n != 2 {
		t.Errorf("%d logins, want one per secret (as gitlab-runner)", n)
	}
	if r := f.requests[0]; r.Info == nil || !r.Info.Features.VaultSecrets {
		t.Errorf("the runner does not announce vault_secrets: %+v", r.Info)
	}
}

func TestResolveSecretsFailures(t *testing.T) {
	secret := func(engine, path, field string) string {
		return `{"S": {"vault": {"engine": {"name": "` + engine + `", "path": "kv"}, "path": "` + path + `", "field": "` + field + `", ` + vaultServer + `}}}`
	}
	tests := []struct {
		name, secrets, reason, msg string
		mutate                     func(v *vaulttest.Server, job *runnerapi.JobResponse)
	}{
		{"login refused", secret("kv-v2", "ci/db", "password"), runnerapi.RunnerConfigurationError, "status code 400",
			func(v *vaulttest.Server, _ *runnerapi.JobResponse) {
				v.Roles["ci"] = vaulttest.Role{BoundAudiences: []string{"other"}}
			}},
		{"read forbidden", secret("kv-v2", "other/db", "password"), runnerapi.RunnerConfigurationError, "status code 403", nil},
		{"vault unavailable", secret("kv-v2", "ci/db", "password"), runnerapi.RunnerExternalDependencyFailure, "status code 503",
			func(v *vaulttest.Server, _ *runnerapi.JobResponse) {
				v.Fail = func(p string) int {
					if strings.HasPrefix(p, "kv/") {
						return http.StatusServiceUnavailable
					}
					return 0
				}
			}},
		{"missing field", secret("kv-v2", "ci/db", "nope"), runnerapi.RunnerSystemFailure, "secret not found", nil},
		{"unknown engine", secret("transit", "ci/db", "password"), runnerapi.RunnerConfigurationError, `secrets engine "transit" is not supported`, nil},
		{"other provider", `{"S": {"gcp_secret_manager": {"name": "x", "version": "1", "server": {"jwt": "$VAULT_ID_TOKEN"}}}}`,
			runnerapi.RunnerConfigurationError, "Berth's runner resolves vault secrets only, not gcp_secret_manager", nil},
		{"no server URL", strings.Replace(secret("kv-v2", "ci/db", "password"), `"url": "VAULT_URL"`, `"url": null`, 1),
			runnerapi.RunnerConfigurationError, "set the VAULT_SERVER_URL variable", nil},
		{"ID token variable missing", secret("kv-v2", "ci/db", "password"), runnerapi.RunnerSystemFailure, "JWT is empty",
			func(_ *vaulttest.Server, job *runnerapi.JobResponse) {
				for i := range job.Variables {
					if job.Variables[i].Key == "VAULT_ID_TOKEN" {
						job.Variables[i].Key = "RENAMED"
					}
				}
			}},
		{"malformed secrets", `{"S": []}`, runnerapi.RunnerConfigurationError, "decoding the job's secrets", nil},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t)
			id := int64(50 + i)
			job, v := vaultJob(t, id, tt.secrets, "echo script-ran")
			if tt.mutate != nil {
				tt.mutate(v, job)
			}
			_, finals := runOne(t, f, job)
			final := lastFinal(t, finals)
			tr := f.trace(id)
			if final.State != "failed" || final.FailureReason != tt.reason {
				t.Errorf("final %+v, want failed with %s\n%s", final, tt.reason, tr)
			}
			if !strings.Contains(tr, "ERROR: Job failed: resolving secrets: ") || !strings.Contains(tr, tt.msg) {
				t.Errorf("trace lacks %q:\n%s", tt.msg, tr)
			}
			if strings.Contains(tr, "script-ran") || strings.Contains(tr, "prepare_executor") {
				t.Errorf("the job went on after resolve_secrets failed:\n%s", tr)
			}
		})
	}
}

func TestParseSecrets(t *testing.T) {
	for _, raw := range []string{"", "null", "{}"} {
		if s, err := parseSecrets(json.RawMessage(raw)); err != nil || len(s) != 0 {
			t.Errorf("parseSecrets(%q) = %v, %v", raw, s, err)
		}
	}
	s, err := parseSecrets(json.RawMessage(`{"B": {"vault": {"engine": {"name": "kv-v2", "path": "kv"}, "path": "p", "field": "f", ` + vaultServer + `}, "file": null},
		"A": {"azure_key_vault": {"name": "n"}, "file": false}}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 2 || s[0].name != "A" || s[0].provider != "azure_key_vault" || s[0].file || s[1].name != "B" || !s[1].file || s[1].vault.Engine.Path != "kv" {
		t.Errorf("parsed %+v", s)
	}
	for _, bad := range []string{`[]`, `{"S": {}}`, `{"S": {"vault": {}, "akeyless": {}}}`, `{"S": {"vault": {"path": "p"}}}`, `{"S": {"vault": 1}}`, `{"S": {"vault": {"server": {}}, "file": "yes"}}`} {
		if _, err := parseSecrets(json.RawMessage(bad)); err == nil {
			t.Errorf("parseSecrets(%s) accepted", bad)
		}
	}
}

// FuzzParseSecrets: the secrets field comes from the coordinator (or a
// real GitLab); no input may panic, and what is accepted is consistent.
func FuzzParseSecrets(f *testing.F) {
	f.Add([]byte(`{"B": {"vault": {"engine": {"name": "kv-v2", "path": "kv"}, "path": "p", "field": "f", ` + vaultServer + `}, "file": false, "token": "$T"}}`))
	f.Add([]byte(`{"A": {"gcp_secret_manager": {"name": "n", "version": "latest", "server": {"jwt": "$T"}}}}`))
	f.Add([]byte(`{"S": {"vault": null, "aws_secrets_manager": {"secret_id": "x"}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := parseSecrets(json.RawMessage(data))
		if err != nil {
			return
		}
		for i, x := range s {
			if (x.vault == nil) == (x.provider == "") {
				t.Fatalf("secret %q: vault %v and provider %q", x.name, x.vault, x.provider)
			}
			if x.vault != nil && x.vault.Server == nil {
				t.Fatalf("secret %q without a server accepted", x.name)
			}
			if i > 0 && s[i-1].name >= x.name {
				t.Fatalf("not sorted: %q before %q", s[i-1].name, x.name)
			}
		}
	})
}
