package ci

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/runnerapi"
)

// RunnerPayload holds the parts of a runner job payload
// (POST /api/v4/jobs/request, gitlab-protocol.md §2) that come from the CI
// configuration, in the JSON shapes the runner decodes. The coordinator
// adds id, token, job_info, git_info, runner_info, its own variables
// (predefined and project) in front of Variables, dependencies with ids and
// tokens, and features.
type RunnerPayload struct {
	Steps     []runnerapi.Step     `json:"steps"`
	Image     *runnerapi.Image     `json:"image,omitempty"`
	Services  []runnerapi.Image    `json:"services"`
	Artifacts []runnerapi.Artifact `json:"artifacts"`
	Cache     []runnerapi.Cache    `json:"cache"`
	Variables []runnerapi.Variable `json:"variables"`
	Hooks     []runnerapi.Hook     `json:"hooks,omitempty"`
	// Timeout is runner_info.timeout in seconds.
	Timeout int `json:"-"`
	// IDTokens are signed at hand-out and become variables; Secrets are
	// the payload's secrets without their server, which the coordinator
	// fills at hand-out from the job's VAULT_* variables.
	IDTokens []IDToken         `json:"-"`
	Secrets  runnerapi.Secrets `json:"-"`
}

// ErrUnresolvedCacheKey is returned by RunnerPayload for a cache:key:files
// or files_commits entry when Compile had no Env.CacheKey to compute the
// key.
var ErrUnresolvedCacheKey = errors.New("cache key:files was not resolved (Env.CacheKey is nil)")

// EffectiveTimeout is the timeout the job runs with, as GitLab computes
// it: the job's timeout, else the project's, capped by the runner's
// maximum when that is set (zero means unset).
func (j *Job) EffectiveTimeout(project, runnerMax time.Duration) time.Duration {
	t := project
	if j.Timeout > 0 {
		t = j.Timeout
	}
	if runnerMax > 0 && (t == 0 || runnerMax < t) {
		t = runnerMax
	}
	return t
}

// SeparateCaches gives p's cache keys and fallback keys GitLab's
// "-protected" or "-non_protected" suffix (GitLab's Ci::Build#cache,
// "Use separate caches for protected branches", on by default): a job of
// a pipeline on a protected ref uses the protected cache unless the entry
// says unprotect: true. j is the job p was built from. The runner uses the
// keys as they come.
func (p *RunnerPayload) SeparateCaches(j *Job, protectedRef bool) {
	for i := range p.Cache {
		suffix := "-non_protected"
		if protectedRef && (i >= len(j.Cache) || !j.Cache[i].Unprotect) {
			suffix = "-protected"
		}
		c := &p.Cache[i]
		c.Key += suffix
		if len(c.FallbackKeys) > 0 {
			fb := make([]string, len(c.FallbackKeys))
			for k, key := range c.FallbackKeys {
				fb[k] = key + suffix
			}
			c.FallbackKeys = fb
		}
	}
}

// RunnerPayload builds the configuration parts of the job payload, with
// timeout as the job's effective timeout (see EffectiveTimeout).
func (j *Job) RunnerPayload(timeout time.Duration) (*RunnerPayload, error) {
	secs := int(timeout / time.Second)
	p := &RunnerPayload{Timeout: secs, Services: []runnerapi.Image{}, Artifacts: []runnerapi.Artifact{}, Cache: []runnerapi.Cache{}}
	script := append(append([]string{}, j.BeforeScript...), j.Script...)
	p.Steps = append(p.Steps, runnerapi.Step{Name: "script", Script: script, Timeout: secs, When: string(OnSuccess)})
	if len(j.AfterScript) > 0 {
		p.Steps = append(p.Steps, runnerapi.Step{Name: "after_script", Script: append([]string{}, j.AfterScript...), Timeout: secs, When: string(Always), AllowFailure: true})
	}
	if j.Image != nil {
		img := payloadImage(*j.Image)
		p.Image = &img
	}
	for _, s := range j.Services {
		p.Services = append(p.Services, payloadImage(s))
	}
	if a := j.Artifacts; a != nil {
		if len(a.Paths) > 0 || a.Untracked {
			p.Artifacts = append(p.Artifacts, runnerapi.Artifact{
				Name: a.Name, Untracked: a.Untracked, Paths: nonNil(a.Paths), Exclude: a.Exclude,
				When: string(a.When), ArtifactType: "archive", ArtifactFormat: "zip", ExpireIn: a.ExpireIn,
			})
		}
		for _, r := range a.Reports {
			typ := r.Type
			if typ == "coverage_report" {
				typ = r.CoverageFormat
			}
			f := reportFormats[typ]
			p.Artifacts = append(p.Artifacts, runnerapi.Artifact{
				Name: f.file, Paths: nonNil(r.Paths), When: string(Always),
				ArtifactType: typ, ArtifactFormat: f.format, ExpireIn: a.ExpireIn,
			})
		}
	}
	for _, c := range j.Cache {
		if c.Key == "" {
			return nil, ErrUnresolvedCacheKey
		}
		p.Cache = append(p.Cache, runnerapi.Cache{
			Key: c.Key, Untracked: c.Untracked, Policy: c.Policy, Paths: nonNil(c.Paths),
			When: string(c.When), FallbackKeys: c.FallbackKeys,
		})
	}
	// The job's own predefined variables first, as GitLab orders them:
	// the file's variables of those names win.
	p.Variables = j.OwnVariables()
	for _, v := range j.Variables {
		p.Variables = append(p.Variables, runnerapi.Variable{Key: v.Key, Value: v.Value, Public: true, Raw: v.Raw})
	}
	// What a Berth runner needs to split the script step at the end of
	// before_script (snapshot points, BERTH_MATRIX_BRANCH; see
	// docs/snapshots.md) and, for a matrix job, to share the matrix's
	// common prefix; other runners ignore them.
	p.Variables = append(p.Variables, runnerapi.Variable{Key: runnerapi.BeforeScriptLinesVariable, Value: strconv.Itoa(len(j.BeforeScript)), Public: true, Raw: true})
	if len(j.Matrix) > 0 {
		names := make([]string, len(j.Matrix))
		for i, v := range j.Matrix {
			names[i] = v.Key
		}
		p.Variables = append(p.Variables,
			runnerapi.Variable{Key: runnerapi.MatrixGroupVariable, Value: j.BaseName, Public: true, Raw: true},
			runnerapi.Variable{Key: runnerapi.MatrixVariablesVariable, Value: strings.Join(names, ","), Public: true, Raw: true})
	}
	if j.Isolation != "" {
		// One BERTH_ISOLATION, last, with the level the job asks for
		// (the keyword may be stronger than the variable).
		kept := p.Variables[:0]
		for _, v := range p.Variables {
			if v.Key != runnerapi.IsolationVariable {
				kept = append(kept, v)
			}
		}
		p.Variables = append(kept, runnerapi.Variable{Key: runnerapi.IsolationVariable, Value: string(j.Isolation), Public: true})
	}
	p.IDTokens = j.IDTokens
	for _, s := range j.Secrets {
		if p.Secrets == nil {
			p.Secrets = runnerapi.Secrets{}
		}
		p.Secrets[s.Name] = payloadSecret(s)
	}
	if len(j.PreGetSourcesScript) > 0 {
		p.Hooks = []runnerapi.Hook{{Name: "pre_get_sources_script", Script: append([]string{}, j.PreGetSourcesScript...)}}
	}
	return p, nil
}

// payloadSecret is a secret as the payload carries it, without the
// server the coordinator adds at hand-out.
func payloadSecret(s Secret) runnerapi.Secret {
	out := runnerapi.Secret{File: s.File, Token: s.Token}
	out.GCPSecretManager, out.AzureKeyVault, out.AWSSecretsManager = s.GCP, s.Azure, s.AWS
	if out.Provider() == "" {
		out.Vault = &runnerapi.VaultSecret{Engine: runnerapi.VaultEngine{Name: s.EngineName, Path: s.EnginePath}, Path: s.Path, Field: s.Field}
	}
	return out
}

func payloadImage(i Image) runnerapi.Image {
	p := runnerapi.Image{Name: i.Name, Alias: i.Alias, Command: i.Command, Entrypoint: i.Entrypoint, PullPolicy: i.PullPolicy}
	for _, v := range i.Variables {
		p.Variables = append(p.Variables, runnerapi.Variable{Key: v.Key, Value: v.Value, Public: true})
	}
	if i.DockerPlatform != "" || i.DockerUser != "" || i.KubernetesUser != "" {
		p.ExecutorOpts = &runnerapi.ExecutorOpts{}
		if i.DockerPlatform != "" || i.DockerUser != "" {
			p.ExecutorOpts.Docker = &runnerapi.DockerOpts{Platform: i.DockerPlatform, User: runnerapi.FlexString(i.DockerUser)}
		}
		if i.KubernetesUser != "" {
			p.ExecutorOpts.Kubernetes = &runnerapi.KubernetesOpts{User: runnerapi.FlexString(i.KubernetesUser)}
		}
	}
	return p
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// OwnVariables are the predefined variables of the job itself that GitLab
// gives the job and its rules alike (predefined_variables(job)):
// CI_JOB_NAME_SLUG, CI_JOB_MANUAL for a manual or delayed job,
// CI_NODE_INDEX when parallel, and CI_NODE_TOTAL (1 unless parallel).
// CI_JOB_NAME and CI_JOB_STAGE are the dispatcher's.
func (j *Job) OwnVariables() []runnerapi.Variable {
	pub := func(k, v string) runnerapi.Variable { return runnerapi.Variable{Key: k, Value: v, Public: true} }
	out := []runnerapi.Variable{pub("CI_JOB_NAME_SLUG", Slug(j.Name, 63))}
	if j.When == Manual || j.When == Delayed {
		out = append(out, pub("CI_JOB_MANUAL", "true"))
	}
	total := 1
	if j.NodeTotal > 0 {
		out = append(out, pub("CI_NODE_INDEX", strconv.Itoa(j.NodeIndex)))
		total = j.NodeTotal
	}
	return append(out, pub("CI_NODE_TOTAL", strconv.Itoa(total)))
}
