package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/coordinator/dispatch"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// VaultBinaryEnv names a Vault (or OpenBao) server binary for the test
// against a real one; without it, vault on PATH. .ci/run builds one from
// the Go module proxy.
const VaultBinaryEnv = "BERTH_VAULT_BINARY"

// realVault is a Vault dev server on loopback, driven through its HTTP
// API with the root token.
type realVault struct {
	t   *testing.T
	url string
}

func startVault(t *testing.T) *realVault {
	t.Helper()
	bin := os.Getenv(VaultBinaryEnv)
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("vault"); err != nil {
			testenv.Missing(t, "no Vault server: set %s or put vault on PATH", VaultBinaryEnv)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	home := t.TempDir()
	var out bytes.Buffer
	cmd := exec.Command(bin, "server", "-dev", "-dev-root-token-id=root", "-dev-listen-address="+addr, "-log-level=warn")
	cmd.Env = append(os.Environ(), "HOME="+home, "VAULT_DISABLE_MLOCK=true", "SKIP_SETCAP=1")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("vault output:\n%s", out.String())
		}
	})
	v := &realVault{t: t, url: "http://" + addr}
	waitFor(t, "Vault to be unsealed", func() bool {
		res, err := http.Get(v.url + "/v1/sys/health")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	return v
}

// api calls Vault with the root token and fails the test on an error.
func (v *realVault) api(method, path string, body any) map[string]any {
	v.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(context.Background(), method, v.url+"/v1/"+path, rd)
	req.Header.Set("X-Vault-Token", "root")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		v.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode >= 300 {
		v.t.Fatalf("vault %s %s: %d %s", method, path, res.StatusCode, raw)
	}
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return out
}

// TestEndToEndRealVault: as TestEndToEndVaultSecrets, against a real
// Vault server whose JWT auth method trusts the coordinator through its
// OIDC discovery document — the setup GitLab documents for Vault.
func TestEndToEndRealVault(t *testing.T) {
	v := startVault(t)
	e := newE2E(t)
	v.api("POST", "sys/auth/jwt", map[string]any{"type": "jwt"})
	v.api("POST", "auth/jwt/config", map[string]any{"oidc_discovery_url": e.url, "bound_issuer": e.url})
	v.api("PUT", "sys/policies/acl/berth-ci", map[string]any{"policy": `
path "secret/data/ci/*" { capabilities = ["read"] }
path "kv1/ci/*" { capabilities = ["read"] }
`})
	v.api("POST", "auth/jwt/role/berth-ci", map[string]any{
		"role_type": "jwt", "user_claim": "project_path", "bound_audiences": []string{"https://vault.example.com"},
		"bound_claims":   map[string]any{"project_path": "group/demo", "ref": "main", "ref_type": "branch"},
		"token_policies": []string{"berth-ci"}, "token_ttl": "5m",
	})
	v.api("POST", "secret/data/ci/db", map[string]any{"data": map[string]any{"password": "real-vault-db-pw"}})
	v.api("POST", "sys/mounts/kv1", map[string]any{"type": "kv", "options": map[string]any{"version": "1"}})
	v.api("POST", "kv1/ci/api", map[string]any{"key": "real-vault-api-key"})
	e.startRunner(t.TempDir())

	spec := func(name, ref string) dispatch.JobSpec {
		f := false
		return dispatch.JobSpec{
			Name: name, ProjectID: 1, ProjectFullPath: "group/demo", Ref: ref, RefType: "branch",
			Sha: "0123456789abcdef0123456789abcdef01234567",
			Steps: script(
				`test "$(cat "$DB_PASSWORD")" = real-vault-db-pw && echo kv2-file-ok`,
				`test "$API_KEY" = real-vault-api-key && echo kv1-env-ok`,
				`echo "leak $API_KEY $(cat "$DB_PASSWORD")"`),
			Variables: []runnerapi.Variable{
				{Key: "VAULT_SERVER_URL", Value: v.url, Public: true},
				{Key: "VAULT_AUTH_ROLE", Value: "berth-ci", Public: true},
			},
			IDTokens: []ci.IDToken{{Name: "VAULT_ID_TOKEN", Aud: []string{"https://vault.example.com"}}},
			Secrets: runnerapi.Secrets{
				"DB_PASSWORD": {Vault: &runnerapi.VaultSecret{Engine: runnerapi.VaultEngine{Name: "kv-v2", Path: "secret"}, Path: "ci/db", Field: "password"}},
				"API_KEY":     {Vault: &runnerapi.VaultSecret{Engine: runnerapi.VaultEngine{Name: "kv-v1", Path: "kv1"}, Path: "ci/api", Field: "key"}, File: &f},
			},
		}
	}
	id := e.enqueue(t, spec("deploy", "main"))
	j := e.waitDone(t, id)
	tr := e.trace(t, id)
	if j.Status != "success" {
		t.Fatalf("deploy: %s %s\n%s", j.Status, j.FailureReason, tr)
	}
	for _, want := range []string{"kv2-file-ok", "kv1-env-ok", "leak [MASKED] [MASKED]"} {
		if !strings.Contains(tr, want) {
			t.Errorf("trace lacks %q:\n%s", want, tr)
		}
	}
	if strings.Contains(tr, "real-vault-") {
		t.Errorf("secret in the trace:\n%s", tr)
	}

	// Vault's bound claims keep a job on another ref out.
	bad := e.enqueue(t, spec("deploy-feature", "feature"))
	jb := e.waitDone(t, bad)
	if trb := e.trace(t, bad); jb.Status != "failed" || jb.FailureReason != runnerapi.RunnerConfigurationError || strings.Contains(trb, "kv2-file-ok") {
		t.Errorf("feature job: %s %s\n%s", jb.Status, jb.FailureReason, trb)
	}
}
