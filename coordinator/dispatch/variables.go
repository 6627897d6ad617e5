package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/runnerapi"
)

// ExpandVariables applies variables in order the way the runner does:
// each value's $VAR, ${VAR} (and $$) expanded with the variables before
// it, unless raw. It returns the values by key (the last one wins).
func ExpandVariables(vs []runnerapi.Variable) map[string]string {
	m := make(map[string]string, len(vs))
	for _, v := range vs {
		val := v.Value
		if !v.Raw && strings.Contains(val, "$") {
			val = ExpandString(val, m)
		}
		m[v.Key] = val
	}
	return m
}

// ExpandString expands $VAR and ${VAR} with vars ($$ is a literal $);
// unknown variables expand to "".
func ExpandString(s string, vars map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	return os.Expand(s, func(k string) string {
		if k == "$" {
			return "$"
		}
		return vars[k]
	})
}

// PredefinedVariables are the CI_* variables that depend on the hand-out
// (job token, runner) or on the coordinator itself (baseURL, its external
// URL without a trailing slash). A job that is no longer handed out gets
// them with an empty token and repository URL.
func PredefinedVariables(baseURL string, j *store.Job, spec *JobSpec, jobToken, repoURL string, rn *store.Runner, timeout int) []runnerapi.Variable {
	base := baseURL
	tags, _ := json.Marshal(httpapi.OrEmpty(rn.Tags))
	pub := func(k, v string) runnerapi.Variable { return runnerapi.Variable{Key: k, Value: v, Public: true} }
	vars := []runnerapi.Variable{
		pub("CI", "true"),
		pub("GITLAB_CI", "true"),
		pub("CI_SERVER", "yes"),
		pub("CI_SERVER_URL", base),
		pub("CI_API_V4_URL", base+"/api/v4"),
		pub("CI_JOB_ID", strconv.FormatInt(j.ID, 10)),
		pub("CI_JOB_NAME", j.Name),
		pub("CI_JOB_STAGE", j.Stage),
		pub("CI_JOB_TIMEOUT", strconv.Itoa(timeout)),
		pub("CI_JOB_URL", fmt.Sprintf("%s/api/v4/projects/%d/jobs/%d", base, j.ProjectID, j.ID)),
		{Key: "CI_JOB_TOKEN", Value: jobToken, Masked: true},
		pub("CI_PROJECT_ID", strconv.FormatInt(j.ProjectID, 10)),
		pub("CI_PIPELINE_ID", strconv.FormatInt(j.PipelineID, 10)),
		pub("CI_RUNNER_ID", strconv.FormatInt(rn.ID, 10)),
		pub("CI_RUNNER_DESCRIPTION", rn.Description),
		pub("CI_RUNNER_TAGS", string(tags)),
	}
	if repoURL != "" {
		vars = append(vars, runnerapi.Variable{Key: "CI_REPOSITORY_URL", Value: repoURL, Masked: false})
	}
	if spec.Sha != "" {
		vars = append(vars, pub("CI_COMMIT_SHA", spec.Sha), pub("CI_COMMIT_SHORT_SHA", ShortSha(spec.Sha)))
	}
	if spec.BeforeSha != "" {
		vars = append(vars, pub("CI_COMMIT_BEFORE_SHA", spec.BeforeSha))
	}
	if spec.Ref != "" {
		vars = append(vars, pub("CI_COMMIT_REF_NAME", spec.Ref))
	}
	return vars
}

// TemplateRegistryHost is CI_TEMPLATE_REGISTRY_HOST, the registry GitLab's
// own CI templates take their images from.
const TemplateRegistryHost = "registry.gitlab.com"

// ShortSha is a commit's short form, as CI_COMMIT_SHORT_SHA shows it.
func ShortSha(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

// JobVariables are the variables a job ran with, expanded as the runner
// expands them: the predefined ones of its hand-out (without its token,
// which is no longer valid) and those of its spec.
func JobVariables(ctx context.Context, st store.Store, baseURL string, j *store.Job, spec *JobSpec) (map[string]string, error) {
	rn := &store.Runner{}
	if j.RunnerID != 0 {
		r, err := st.GetRunner(ctx, j.RunnerID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		if r != nil {
			rn = r
		}
	}
	vars := PredefinedVariables(baseURL, j, spec, "", "", rn, spec.Timeout)
	return ExpandVariables(slices.Concat(vars, spec.Variables)), nil
}

// DebugMode reports whether a job's log is a debug trace, as GitLab's
// debug_mode? decides: its runner said so (store.Job.DebugTrace), or its
// variables set CI_DEBUG_TRACE or CI_DEBUG_SERVICES true (a runner too old
// to say). Such a log may hold every variable's value: only the project's
// developers and admins read it (DebugTraceForbidden).
func DebugMode(j *store.Job) bool {
	if j.DebugTrace {
		return true
	}
	if !bytes.Contains(j.Spec, []byte("CI_DEBUG_")) {
		return false
	}
	var spec struct {
		Variables []runnerapi.Variable `json:"variables"`
	}
	if err := json.Unmarshal(j.Spec, &spec); err != nil {
		return false
	}
	vars := ExpandVariables(spec.Variables)
	return truthy(vars["CI_DEBUG_TRACE"]) || truthy(vars["CI_DEBUG_SERVICES"])
}

// truthy is GitLab's Gitlab::Utils.to_boolean for true.
func truthy(s string) bool {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true", "t", "yes", "y", "1", "on":
		return true
	}
	return false
}

// DebugTraceForbidden is GitLab's answer to a reader of a debug trace
// below the Developer role.
const DebugTraceForbidden = "You must have developer or higher permissions in the associated project to view job logs when debug trace is enabled. " +
	"To disable debug trace, set the 'CI_DEBUG_TRACE' and 'CI_DEBUG_SERVICES' variables to 'false' in your pipeline configuration or CI/CD settings. " +
	"If you must view this job log, a project maintainer or owner must add you to the project with developer permissions or higher."
