package custom

import (
	"encoding/json"
	"os"
	"slices"
	"strings"

	"github.com/berthci/berth/runnerapi"
)

// variables is an ordered list of job variables, values expanded; a later
// entry wins over an earlier one with the same key.
type variables []runnerapi.Variable

// value is the last value of key ("" when absent).
func (vs variables) value(key string) string {
	v := ""
	for _, x := range vs {
		if x.Key == key {
			v = x.Value
		}
	}
	return v
}

// expand returns vs with every non-raw value's $VAR and ${VAR} references
// replaced by the value of an earlier variable, as the runner expands the
// variables of the job's scripts ($$ is a literal $).
func expand(vs []runnerapi.Variable) variables {
	out := make(variables, len(vs))
	lookup := map[string]string{}
	for i, v := range vs {
		if !v.Raw && strings.Contains(v.Value, "$") {
			v.Value = expandValue(v.Value, lookup)
		}
		out[i] = v
		lookup[v.Key] = v.Value
	}
	return out
}

func expandValue(s string, lookup map[string]string) string {
	return os.Expand(s, func(k string) string {
		if k == "$" {
			return "$"
		}
		return lookup[k]
	})
}

// jobVariables are the variables the driver sees as CUSTOM_ENV_*: facts
// the executor knows (job id, concurrency id, short token and, once
// config_exec described the environment, CI_BUILDS_DIR and CI_PROJECT_DIR)
// first, so that the job's variables can refer to them, then the job's
// variables without those named in hide, then the facts again: a job
// cannot make them lie to the driver. CI_JOB_IMAGE, the job's image name
// with its variables expanded, comes before the job's own variables as in
// GitLab.
func jobVariables(job *runnerapi.JobResponse, facts []runnerapi.Variable, hide ...string) variables {
	all := make([]runnerapi.Variable, 0, 2*len(facts)+len(job.Variables))
	all = append(all, facts...)
	for _, v := range job.Variables {
		if !slices.Contains(hide, v.Key) {
			all = append(all, v)
		}
	}
	vs := expand(append(all, facts...))
	if job.Image != nil && job.Image.Name != "" {
		lookup := map[string]string{}
		for _, v := range vs {
			lookup[v.Key] = v.Value
		}
		img := runnerapi.Variable{Key: "CI_JOB_IMAGE", Value: expandValue(job.Image.Name, lookup), Public: true, Raw: true}
		vs = append(variables{img}, vs...)
	}
	return vs
}

// jsonService is one entry of CI_JOB_SERVICES, field for field GitLab's.
type jsonService struct {
	Name       string            `json:"name"`
	Alias      string            `json:"alias"`
	Entrypoint []string          `json:"entrypoint"`
	Command    []string          `json:"command"`
	Variables  map[string]string `json:"variables,omitempty"`
}

// servicesJSON is CI_JOB_SERVICES: a JSON array of the job's services
// ("" when it has none, as GitLab sends it). alias is a service's first
// alias; variables are the service's own, expanded with the job's.
func servicesJSON(services []runnerapi.Image, vs variables) string {
	if len(services) == 0 {
		return ""
	}
	out := make([]jsonService, 0, len(services))
	for _, s := range services {
		js := jsonService{Name: s.Name, Entrypoint: s.Entrypoint, Command: s.Command}
		if aliases := strings.Fields(strings.ReplaceAll(s.Alias, ",", " ")); len(aliases) > 0 {
			js.Alias = aliases[0]
		}
		if len(s.Variables) > 0 {
			exp := expand(append(append([]runnerapi.Variable{}, vs...), s.Variables...))
			js.Variables = make(map[string]string, len(s.Variables))
			for _, v := range s.Variables {
				js.Variables[v.Key] = exp.value(v.Key)
			}
		}
		out = append(out, js)
	}
	b, _ := json.Marshal(out) // strings, slices and maps of strings always marshal
	return string(b)
}

// customEnv renders vs and CI_JOB_SERVICES as CUSTOM_ENV_<KEY>=<value>
// entries, one per key (the last value wins). Variables that cannot be
// environment entries (a key with "=" or a NUL byte anywhere) are left
// out.
func customEnv(vs variables, services string) []string {
	last := map[string]int{}
	for i, v := range vs {
		last[v.Key] = i
	}
	env := make([]string, 0, len(last)+1)
	for i, v := range vs {
		if last[v.Key] != i || v.Key == "CI_JOB_SERVICES" || !validEnvKey(v.Key) || strings.ContainsRune(v.Value, 0) {
			continue
		}
		env = append(env, "CUSTOM_ENV_"+v.Key+"="+v.Value)
	}
	return append(env, "CUSTOM_ENV_CI_JOB_SERVICES="+services)
}
