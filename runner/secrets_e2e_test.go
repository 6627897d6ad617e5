package runner

import (
	"strings"
	"testing"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/runner/vault/vaulttest"
	"github.com/berthci/berth/runnerapi"
)

// TestEndToEndVaultSecrets: Berth's coordinator signs the job's ID token,
// Berth's runner logs in to a Vault (the fake, verifying the token against
// the coordinator's OIDC discovery and JWKS as Vault's JWT auth method does
// with oidc_discovery_url) and gives the job the secret.
func TestEndToEndVaultSecrets(t *testing.T) {
	e := newE2E(t)
	v := vaulttest.New()
	t.Cleanup(v.Close)
	v.Issuer = e.url
	v.Roles["berth-ci"] = vaulttest.Role{
		BoundAudiences: []string{"https://vault.example.com"},
		BoundClaims:    map[string]string{"project_path": "group/demo", "ref": "main", "ref_type": "branch"},
		Policies:       []string{"kv/data/ci/*"},
	}
	v.KV2["kv"] = map[string]map[string]any{"ci/db": {"password": "e2e-db-password-77"}}
	e.startRunner(t.TempDir())

	spec := func(name, ref string) int64 {
		return e.enqueue(t, vaultSpec(name, ref, v.URL))
	}
	ok := spec("deploy", "main")
	jo := e.waitDone(t, ok)
	tr := e.trace(t, ok)
	if jo.Status != "success" {
		t.Fatalf("deploy: %s %s\n%s", jo.Status, jo.FailureReason, tr)
	}
	for _, want := range []string{"Resolving secrets", "password-file-ok", "token [MASKED]", "password [MASKED]"} {
		if !strings.Contains(tr, want) {
			t.Errorf("trace lacks %q:\n%s", want, tr)
		}
	}
	if strings.Contains(tr, "e2e-db-password-77") {
		t.Errorf("secret in the trace:\n%s", tr)
	}
	logins := v.Logins()
	if len(logins) != 1 || logins[0]["iss"] != e.url || logins[0]["job_id"] == nil {
		t.Errorf("logins %v", logins)
	}

	// A job on another ref: Vault's bound claims refuse it; the job fails
	// with the reason gitlab-runner gives, before its script.
	bad := spec("deploy-feature", "feature")
	jb := e.waitDone(t, bad)
	if tr := e.trace(t, bad); jb.Status != "failed" || jb.FailureReason != runnerapi.RunnerConfigurationError || strings.Contains(tr, "password-file-ok") {
		t.Errorf("feature job: %s %s\n%s", jb.Status, jb.FailureReason, tr)
	}
}

// vaultSpec is a job asking for a Vault secret with an ID token.
func vaultSpec(name, ref, vaultURL string) dispatch.JobSpec {
	return dispatch.JobSpec{
		Name: name, ProjectID: 1, ProjectFullPath: "group/demo", Ref: ref, RefType: "branch",
		Sha:   "0123456789abcdef0123456789abcdef01234567",
		Steps: script(`test "$(cat "$DB_PASSWORD")" = e2e-db-password-77 && echo password-file-ok`, `echo "token $VAULT_ID_TOKEN"`, `echo "password $(cat "$DB_PASSWORD")"`),
		Variables: []runnerapi.Variable{
			{Key: "VAULT_SERVER_URL", Value: vaultURL, Public: true},
			{Key: "VAULT_AUTH_ROLE", Value: "berth-ci", Public: true},
		},
		IDTokens: []ci.IDToken{{Name: "VAULT_ID_TOKEN", Aud: []string{"https://vault.example.com"}}},
		Secrets: runnerapi.Secrets{"DB_PASSWORD": {Vault: &runnerapi.VaultSecret{
			Engine: runnerapi.VaultEngine{Name: "kv-v2", Path: "kv"}, Path: "ci/db", Field: "password"}}},
	}
}
