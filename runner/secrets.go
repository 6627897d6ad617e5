package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/berthci/berth/runner/vault"
	"github.com/berthci/berth/runnerapi"
)

// The resolve_secrets stage, as gitlab-runner's (common/build.go
// resolveSecrets, common/secrets.go, helpers/secrets/resolvers/vault): each
// secret of the payload is read from Vault, logged in to with the JWT auth
// method, and becomes a masked variable (a file variable unless the job
// said file: false). A failure fails the job before anything runs.

// secretProviders are the secret providers GitLab may send; Berth's
// runner resolves vault only.
var secretProviders = []string{"vault", "gcp_secret_manager", "azure_key_vault", "aws_secrets_manager",
	"akeyless", "gitlab_secrets_manager"}

// jobSecret is one entry of the payload's secrets.
type jobSecret struct {
	name  string
	vault *runnerapi.VaultSecret
	file  bool
	// provider names a provider other than vault (then vault is nil).
	provider string
}

// parseSecrets reads the payload's secrets field, sorted by name. A
// secret of another provider is returned with that provider's name; one
// with none, or several, is an error.
func parseSecrets(raw json.RawMessage) ([]jobSecret, error) {
	if s := strings.TrimSpace(string(raw)); s == "" || s == "null" {
		return nil, nil
	}
	var entries map[string]map[string]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fmt.Errorf("decoding the job's secrets: %w", err)
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []jobSecret
	for _, n := range names {
		e := entries[n]
		s := jobSecret{name: n, file: true}
		if f, ok := e["file"]; ok && strings.TrimSpace(string(f)) != "null" {
			if err := json.Unmarshal(f, &s.file); err != nil {
				return nil, fmt.Errorf("secret %s: file: %w", n, err)
			}
		}
		var used []string
		for _, p := range secretProviders {
			if v, ok := e[p]; ok && strings.TrimSpace(string(v)) != "null" {
				used = append(used, p)
			}
		}
		if len(used) != 1 {
			return nil, fmt.Errorf("secret %s: want exactly one provider of %s", n, strings.Join(secretProviders, ", "))
		}
		if used[0] != "vault" {
			s.provider = used[0]
			out = append(out, s)
			continue
		}
		s.vault = &runnerapi.VaultSecret{}
		if err := json.Unmarshal(e["vault"], s.vault); err != nil {
			return nil, fmt.Errorf("secret %s: vault: %w", n, err)
		}
		if s.vault.Server == nil {
			return nil, fmt.Errorf("secret %s: vault: no server", n)
		}
		out = append(out, s)
	}
	return out, nil
}

// secretError is a failure to resolve secrets, with the failure reason
// gitlab-runner reports for it.
type secretError struct {
	reason string
	err    error
}

func (e *secretError) Error() string { return e.err.Error() }
func (e *secretError) Unwrap() error { return e.err }

// classifySecretError gives a resolving error gitlab-runner's failure
// reason: Vault refusing the request (400, 401, 403, 404) is the job's
// configuration, Vault failing (5xx) an external dependency, anything
// else a system failure.
func classifySecretError(err error) error {
	var se *secretError
	if errors.As(err, &se) {
		return err
	}
	var ae *vault.APIError
	if errors.As(err, &ae) {
		switch c := ae.StatusCode; {
		case c == http.StatusBadRequest || c == http.StatusUnauthorized || c == http.StatusForbidden || c == http.StatusNotFound:
			return &secretError{reason: runnerapi.RunnerConfigurationError, err: err}
		case c >= 500:
			return &secretError{reason: runnerapi.RunnerExternalDependencyFailure, err: err}
		}
	}
	return &secretError{reason: runnerapi.RunnerSystemFailure, err: err}
}

func configError(format string, args ...any) error {
	return &secretError{reason: runnerapi.RunnerConfigurationError, err: fmt.Errorf(format, args...)}
}

// resolveSecrets resolves the job's secrets into variables (none when it
// has none), writing gitlab-runner's lines to the trace.
func (r *jobRun) resolveSecrets(ctx context.Context) ([]runnerapi.Variable, error) {
	secrets, err := parseSecrets(r.job.Secrets)
	if err != nil {
		return nil, configError("%w", err)
	}
	if len(secrets) == 0 {
		return nil, nil
	}
	var out []runnerapi.Variable
	err = r.section("resolve_secrets", "Resolving secrets", func() error {
		lookup := r.secretLookup()
		expand := func(s string) string {
			return os.Expand(s, func(k string) string {
				if k == "$" {
					return "$"
				}
				return lookup[k]
			})
		}
		for _, s := range secrets {
			r.tr.Printf("Resolving secret %q...\n", s.name)
			if s.vault == nil {
				return configError("secret %s: Berth's runner resolves vault secrets only, not %s: run this job on GitLab's runner (gitlab-runner resolves it)", s.name, s.provider)
			}
			r.tr.Printf("Using %q secret resolver...\n", "vault")
			val, err := r.readVault(ctx, s, expand)
			if err != nil {
				return classifySecretError(fmt.Errorf("secret %s: %w", s.name, err))
			}
			r.tr.Mask(val)
			out = append(out, runnerapi.Variable{Key: s.name, Value: val, File: s.file, Masked: true, Raw: true})
		}
		return nil
	})
	if err != nil {
		return nil, classifySecretError(err)
	}
	return out, nil
}

// readVault logs in and reads one secret, every field of it expanded with
// the job's variables first (as gitlab-runner's Secrets.ExpandVariables).
func (r *jobRun) readVault(ctx context.Context, s jobSecret, expand func(string) string) (string, error) {
	v := s.vault
	srv := v.Server
	deref := func(p *string) string {
		if p == nil {
			return ""
		}
		return expand(*p)
	}
	if name := expand(srv.Auth.Name); name != "jwt" {
		return "", configError("Vault auth method %q is not supported (Berth logs in with jwt)", name)
	}
	engine := expand(v.Engine.Name)
	if !slices.Contains(vault.Engines, engine) {
		return "", configError("secrets engine %q is not supported (want %s)", engine, strings.Join(vault.Engines, ", "))
	}
	c := &vault.Client{URL: deref(srv.URL), Namespace: deref(srv.Namespace)}
	if c.URL == "" {
		return "", configError("no Vault server: set the VAULT_SERVER_URL variable")
	}
	token, err := c.Login(ctx, expand(srv.Auth.Path), expand(srv.Auth.Data.JWT), deref(srv.Auth.Data.Role))
	if err != nil {
		return "", err
	}
	// A missing secret or field fails the job, as gitlab-runner with
	// FF_SECRET_RESOLVING_FAILS_IF_MISSING (on by default).
	return c.Read(ctx, token, engine, expand(v.Engine.Path), expand(v.Path), expand(v.Field))
}

// secretLookup is the job's variables as the runner expands them before
// the environment exists (its own configured environment included).
func (r *jobRun) secretLookup() map[string]string {
	vars := append([]runnerapi.Variable{}, r.job.Variables...)
	for _, e := range r.w.rc.Environment {
		if k, v, ok := strings.Cut(e, "="); ok {
			vars = append(vars, runnerapi.Variable{Key: k, Value: v})
		}
	}
	m := map[string]string{}
	for _, v := range vars {
		val := v.Value
		if !v.Raw && strings.Contains(val, "$") {
			val = os.Expand(val, func(k string) string {
				if k == "$" {
					return "$"
				}
				return m[k]
			})
		}
		m[v.Key] = val
	}
	return m
}
