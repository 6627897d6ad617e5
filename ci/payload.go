package ci

import (
	"errors"
	"strconv"
	"time"
)

// RunnerPayload holds the parts of a runner job payload
// (POST /api/v4/jobs/request, gitlab-protocol.md §2) that come from the CI
// configuration, in the JSON shapes the runner decodes. The coordinator
// adds id, token, job_info, git_info, runner_info, its own variables
// (predefined and project) in front of Variables, dependencies with ids and
// tokens, and features.
type RunnerPayload struct {
	Steps     []PayloadStep     `json:"steps"`
	Image     *PayloadImage     `json:"image,omitempty"`
	Services  []PayloadImage    `json:"services"`
	Artifacts []PayloadArtifact `json:"artifacts"`
	Cache     []PayloadCache    `json:"cache"`
	Variables []PayloadVariable `json:"variables"`
	Hooks     []PayloadHook     `json:"hooks,omitempty"`
	// Timeout is runner_info.timeout in seconds.
	Timeout int `json:"-"`
}

// PayloadStep is one entry of steps.
type PayloadStep struct {
	Name         string   `json:"name"`
	Script       []string `json:"script"`
	Timeout      int      `json:"timeout"`
	When         string   `json:"when"`
	AllowFailure bool     `json:"allow_failure"`
}

// PayloadImage is image or one of services.
type PayloadImage struct {
	Name         string               `json:"name"`
	Alias        string               `json:"alias,omitempty"`
	Command      []string             `json:"command,omitempty"`
	Entrypoint   []string             `json:"entrypoint,omitempty"`
	Variables    []PayloadVariable    `json:"variables,omitempty"`
	PullPolicy   []string             `json:"pull_policy,omitempty"`
	ExecutorOpts *PayloadExecutorOpts `json:"executor_opts,omitempty"`
}

// PayloadExecutorOpts is image.executor_opts.
type PayloadExecutorOpts struct {
	Docker     *PayloadDockerOpts     `json:"docker,omitempty"`
	Kubernetes *PayloadKubernetesOpts `json:"kubernetes,omitempty"`
}

// PayloadDockerOpts is executor_opts.docker.
type PayloadDockerOpts struct {
	Platform string `json:"platform,omitempty"`
	User     string `json:"user,omitempty"`
}

// PayloadKubernetesOpts is executor_opts.kubernetes.
type PayloadKubernetesOpts struct {
	User string `json:"user,omitempty"`
}

// PayloadArtifact is one entry of artifacts.
type PayloadArtifact struct {
	Name           string   `json:"name,omitempty"`
	Untracked      bool     `json:"untracked"`
	Paths          []string `json:"paths"`
	Exclude        []string `json:"exclude,omitempty"`
	When           string   `json:"when"`
	ArtifactType   string   `json:"artifact_type"`
	ArtifactFormat string   `json:"artifact_format"`
	ExpireIn       string   `json:"expire_in,omitempty"`
}

// PayloadCache is one entry of cache.
type PayloadCache struct {
	Key          string   `json:"key"`
	Untracked    bool     `json:"untracked"`
	Policy       string   `json:"policy"`
	Paths        []string `json:"paths"`
	When         string   `json:"when"`
	FallbackKeys []string `json:"fallback_keys,omitempty"`
}

// PayloadVariable is one entry of variables.
type PayloadVariable struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Public bool   `json:"public"`
	File   bool   `json:"file"`
	Masked bool   `json:"masked"`
	Raw    bool   `json:"raw"`
}

// PayloadHook is one entry of hooks.
type PayloadHook struct {
	Name   string   `json:"name"`
	Script []string `json:"script"`
}

// ErrUnresolvedCacheKey is returned by RunnerPayload for a cache:key:files
// entry when Compile had no Env.CacheKey to compute the key.
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

// RunnerPayload builds the configuration parts of the job payload, with
// timeout as the job's effective timeout (see EffectiveTimeout).
func (j *Job) RunnerPayload(timeout time.Duration) (*RunnerPayload, error) {
	secs := int(timeout / time.Second)
	p := &RunnerPayload{Timeout: secs, Services: []PayloadImage{}, Artifacts: []PayloadArtifact{}, Cache: []PayloadCache{}}
	script := append(append([]string{}, j.BeforeScript...), j.Script...)
	p.Steps = append(p.Steps, PayloadStep{Name: "script", Script: script, Timeout: secs, When: string(OnSuccess)})
	if len(j.AfterScript) > 0 {
		p.Steps = append(p.Steps, PayloadStep{Name: "after_script", Script: append([]string{}, j.AfterScript...), Timeout: secs, When: string(Always), AllowFailure: true})
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
			p.Artifacts = append(p.Artifacts, PayloadArtifact{
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
			p.Artifacts = append(p.Artifacts, PayloadArtifact{
				Name: f.file, Paths: nonNil(r.Paths), When: string(Always),
				ArtifactType: typ, ArtifactFormat: f.format, ExpireIn: a.ExpireIn,
			})
		}
	}
	for _, c := range j.Cache {
		if c.Key == "" {
			return nil, ErrUnresolvedCacheKey
		}
		p.Cache = append(p.Cache, PayloadCache{
			Key: c.Key, Untracked: c.Untracked, Policy: c.Policy, Paths: nonNil(c.Paths),
			When: string(c.When), FallbackKeys: c.FallbackKeys,
		})
	}
	p.Variables = []PayloadVariable{}
	for _, v := range j.Variables {
		p.Variables = append(p.Variables, PayloadVariable{Key: v.Key, Value: v.Value, Public: true, Raw: v.Raw})
	}
	if j.NodeTotal > 0 {
		p.Variables = append(p.Variables,
			PayloadVariable{Key: "CI_NODE_INDEX", Value: strconv.Itoa(j.NodeIndex), Public: true},
			PayloadVariable{Key: "CI_NODE_TOTAL", Value: strconv.Itoa(j.NodeTotal), Public: true})
	}
	if len(j.PreGetSourcesScript) > 0 {
		p.Hooks = []PayloadHook{{Name: "pre_get_sources_script", Script: append([]string{}, j.PreGetSourcesScript...)}}
	}
	return p, nil
}

func payloadImage(i Image) PayloadImage {
	p := PayloadImage{Name: i.Name, Alias: i.Alias, Command: i.Command, Entrypoint: i.Entrypoint, PullPolicy: i.PullPolicy}
	for _, v := range i.Variables {
		p.Variables = append(p.Variables, PayloadVariable{Key: v.Key, Value: v.Value, Public: true})
	}
	if i.DockerPlatform != "" || i.DockerUser != "" || i.KubernetesUser != "" {
		p.ExecutorOpts = &PayloadExecutorOpts{}
		if i.DockerPlatform != "" || i.DockerUser != "" {
			p.ExecutorOpts.Docker = &PayloadDockerOpts{Platform: i.DockerPlatform, User: i.DockerUser}
		}
		if i.KubernetesUser != "" {
			p.ExecutorOpts.Kubernetes = &PayloadKubernetesOpts{User: i.KubernetesUser}
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
