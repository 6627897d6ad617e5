package dispatch

import (
	"errors"
	"fmt"
	"strings"

	"github.com/berthci/berth/ci"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runnerapi"
)

// JobSpec is everything about a job that is not generated when it is
// handed to a runner: what POST /api/v4/berth/jobs takes, and what
// pipelines produce. Generated at hand-out: the job id and token,
// job_info, credentials in git_info.repo_url, runner_info, predefined
// variables, dependency tokens and artifact files.
type JobSpec struct {
	Name            string  `json:"name"`
	Stage           string  `json:"stage,omitempty"`
	ProjectID       int64   `json:"project_id"`
	ProjectName     string  `json:"project_name,omitempty"`
	ProjectFullPath string  `json:"project_full_path,omitempty"`
	NamespaceID     int64   `json:"namespace_id,omitempty"`
	RootNamespaceID int64   `json:"root_namespace_id,omitempty"`
	NamespaceIDs    []int64 `json:"namespace_ids,omitempty"`
	PipelineID      int64   `json:"pipeline_id,omitempty"`

	Ref           string   `json:"ref,omitempty"`
	RefType       string   `json:"ref_type,omitempty"`
	Sha           string   `json:"sha,omitempty"`
	BeforeSha     string   `json:"before_sha,omitempty"`
	Protected     bool     `json:"protected,omitempty"`
	RepoURL       string   `json:"repo_url,omitempty"`
	Refspecs      []string `json:"refspecs,omitempty"`
	Depth         int      `json:"depth,omitempty"`
	AllowGitFetch bool     `json:"allow_git_fetch,omitempty"`

	Tags     []string `json:"tags,omitempty"`
	Priority int      `json:"priority,omitempty"`
	Timeout  int      `json:"timeout,omitempty"`
	// Isolation is the isolation level the job asks for (none, cgroups,
	// container, microvm, vm, instance; empty: none). A BERTH_ISOLATION
	// variable asks too; the stronger of the two counts, and the project's
	// minimum raises it (docs/isolation.md).
	Isolation string `json:"isolation,omitempty"`

	Variables []runnerapi.Variable `json:"variables,omitempty"`
	// HighVariables is how many of the last Variables are the project's
	// and the pipeline's: the variables of the dependencies' dotenv
	// reports go before them at hand-out (GitLab's precedence). Specs
	// stored before it have 0: their dotenv variables go last.
	HighVariables int `json:"high_variables,omitempty"`

	Steps        []runnerapi.Step        `json:"steps,omitempty"`
	Hooks        []runnerapi.Hook        `json:"hooks,omitempty"`
	Image        *runnerapi.Image        `json:"image,omitempty"`
	Services     []runnerapi.Image       `json:"services,omitempty"`
	Artifacts    []runnerapi.Artifact    `json:"artifacts,omitempty"`
	Cache        []runnerapi.Cache       `json:"cache,omitempty"`
	Credentials  []runnerapi.Credentials `json:"credentials,omitempty"`
	Dependencies []int64                 `json:"dependencies,omitempty"`

	// IDTokens are signed at hand-out and given to the job as masked
	// variables; Secrets become the payload's secrets, their Vault server
	// filled at hand-out from the job's VAULT_* variables (runnerhttp).
	// PipelineSource and CIConfigPath feed the tokens' claims (the
	// environment ones come from the job's graph).
	IDTokens       []ci.IDToken      `json:"id_tokens,omitempty"`
	Secrets        runnerapi.Secrets `json:"secrets,omitempty"`
	PipelineSource string            `json:"pipeline_source,omitempty"`
	CIConfigPath   string            `json:"ci_config_path,omitempty"`
}

// ParseIsolation parses a level named through the API; empty means none
// was named and is returned as is.
func ParseIsolation(s string) (executor.Isolation, error) {
	if s == "" {
		return "", nil
	}
	return executor.ParseIsolation(s)
}

// IsolationNames lists the isolation levels for error messages.
var IsolationNames = func() string {
	s := make([]string, len(executor.Isolations))
	for i, l := range executor.Isolations {
		s[i] = string(l)
	}
	return strings.Join(s, ", ")
}()

// RequestedIsolation is the level the job asks for: the stronger of
// Isolation and the last BERTH_ISOLATION variable (the one the runner
// sees); empty when neither names a level. Call it on a valid spec.
func (j *JobSpec) RequestedIsolation() executor.Isolation {
	asked, _ := ParseIsolation(j.Isolation)
	val := ""
	for _, v := range j.Variables {
		if v.Key == runnerapi.IsolationVariable {
			val = v.Value
		}
	}
	fromVar, _ := ParseIsolation(val)
	return executor.StrongerIsolation(asked, fromVar)
}

// MaxJobTimeout bounds a job's timeout, in seconds: one month, as GitLab.
const MaxJobTimeout = 30 * 24 * 3600

var validWhen = map[string]bool{"on_success": true, "on_failure": true, "always": true}

// Validate checks a spec, naming the offending field.
func (j *JobSpec) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if strings.TrimSpace(j.Name) == "" {
		bad("name", "is required")
	}
	if len(j.Name) > 255 {
		bad("name", "is longer than 255 characters")
	}
	if j.ProjectID <= 0 {
		bad("project_id", "must be a positive integer")
	}
	if j.Timeout < 0 || j.Timeout > MaxJobTimeout {
		bad("timeout", "must be between 0 and %d seconds (one month, GitLab's limit), not %d", MaxJobTimeout, j.Timeout)
	}
	if j.Depth < 0 {
		bad("depth", "must not be negative")
	}
	switch j.RefType {
	case "", "branch", "tag":
	default:
		bad("ref_type", "must be branch or tag, not %q", j.RefType)
	}
	if len(j.Steps) == 0 {
		bad("steps", "at least one step is required")
	}
	for i, st := range j.Steps {
		if st.Name == "" {
			bad(fmt.Sprintf("steps[%d].name", i), "is required")
		}
		if st.When != "" && !validWhen[st.When] {
			bad(fmt.Sprintf("steps[%d].when", i), "must be on_success, on_failure or always, not %q", st.When)
		}
		if st.Timeout < 0 || st.Timeout > MaxJobTimeout {
			bad(fmt.Sprintf("steps[%d].timeout", i), "must be between 0 and %d seconds, not %d", MaxJobTimeout, st.Timeout)
		}
	}
	if _, err := ParseIsolation(j.Isolation); err != nil {
		bad("isolation", "must be one of %s, not %q", IsolationNames, j.Isolation)
	}
	for i, v := range j.Variables {
		if v.Key == "" {
			bad(fmt.Sprintf("variables[%d].key", i), "is required")
		}
		if v.Key == runnerapi.IsolationVariable {
			if _, err := ParseIsolation(v.Value); err != nil {
				bad(fmt.Sprintf("variables[%d].value", i), "%s must be one of %s, not %q", v.Key, IsolationNames, v.Value)
			}
		}
	}
	if j.HighVariables < 0 || j.HighVariables > len(j.Variables) {
		bad("high_variables", "must be between 0 and the number of variables (%d), not %d", len(j.Variables), j.HighVariables)
	}
	for i, a := range j.Artifacts {
		if a.When != "" && !validWhen[a.When] {
			bad(fmt.Sprintf("artifacts[%d].when", i), "must be on_success, on_failure or always, not %q", a.When)
		}
	}
	for i, c := range j.Cache {
		switch {
		case c.Policy == "", c.Policy == "pull", c.Policy == "push", c.Policy == "pull-push":
		case strings.Contains(c.Policy, "$"): // expanded and checked by the runner
		default:
			bad(fmt.Sprintf("cache[%d].policy", i), "must be pull, push or pull-push, not %q", c.Policy)
		}
	}
	for i, d := range j.Dependencies {
		if d <= 0 {
			bad(fmt.Sprintf("dependencies[%d]", i), "must be a job id")
		}
	}
	errs = append(errs, validateIDTokens(j.IDTokens, j.Secrets)...)
	return errors.Join(errs...)
}

// validateIDTokens checks the id_tokens and secrets of a spec.
func validateIDTokens(idTokens []ci.IDToken, secrets runnerapi.Secrets) []error {
	var errs []error
	seen := map[string]bool{}
	for i, t := range idTokens {
		switch {
		case t.Name == "":
			errs = append(errs, fmt.Errorf("id_tokens[%d].name: is required", i))
		case seen[t.Name]:
			errs = append(errs, fmt.Errorf("id_tokens[%d].name: %s is defined twice", i, t.Name))
		}
		seen[t.Name] = true
		if !t.AudList && len(t.Aud) != 1 {
			errs = append(errs, fmt.Errorf("id_tokens[%d].aud: one audience unless aud_list is set", i))
		}
	}
	for name, sec := range secrets {
		n := 0
		for _, set := range []bool{sec.Vault != nil, sec.GCPSecretManager != nil, sec.AzureKeyVault != nil, sec.AWSSecretsManager != nil} {
			if set {
				n++
			}
		}
		p := sec.Provider()
		switch {
		case n != 1:
			errs = append(errs, fmt.Errorf("secrets.%s: exactly one of vault, gcp_secret_manager, azure_key_vault, aws_secrets_manager is required", name))
		case p == "vault" && (sec.Vault.Engine.Name == "" || sec.Vault.Engine.Path == ""):
			errs = append(errs, fmt.Errorf("secrets.%s.vault.engine: name and path are required", name))
		case p == "gcp_secret_manager" && (sec.GCPSecretManager.Name == "" || sec.Token == ""):
			errs = append(errs, fmt.Errorf("secrets.%s: gcp_secret_manager.name and token are required", name))
		case p == "azure_key_vault" && sec.AzureKeyVault.Name == "":
			errs = append(errs, fmt.Errorf("secrets.%s.azure_key_vault.name: is required", name))
		case (p == "vault" && sec.Vault.Server != nil) || (p == "gcp_secret_manager" && sec.GCPSecretManager.Server != nil) ||
			(p == "azure_key_vault" && sec.AzureKeyVault.Server != nil) || (p == "aws_secrets_manager" && sec.AWSSecretsManager.Server != nil):
			errs = append(errs, fmt.Errorf("secrets.%s.%s.server: is filled by the coordinator at hand-out", name, p))
		}
	}
	return errs
}
