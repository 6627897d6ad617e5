package runner

import (
	"slices"
	"testing"

	"github.com/berthci/berth/runnerapi"
)

func TestSnapshotPoints(t *testing.T) {
	job := func(vals ...string) *runnerapi.JobResponse {
		j := &runnerapi.JobResponse{}
		for _, v := range vals {
			j.Variables = append(j.Variables, runnerapi.Variable{Key: SnapshotVariable, Value: v})
		}
		return j
	}
	for _, c := range []struct {
		job             *runnerapi.JobResponse
		points, unknown []string
	}{
		{job(), nil, nil},
		{job("on_failure"), []string{"on_failure"}, nil},
		{job("before_script, on_failure end"), []string{"before_script", "on_failure", "end"}, nil},
		{job("get_sources,after_script nope"), []string{"get_sources"}, []string{"after_script", "nope"}},
		{job("on_failure", ""), nil, nil}, // a job variable overrides the project's
	} {
		p, u := snapshotPoints(c.job)
		if !slices.Equal(p, c.points) || !slices.Equal(u, c.unknown) {
			t.Errorf("%v: points %q unknown %q, want %q %q", c.job.Variables, p, u, c.points, c.unknown)
		}
	}
}

// TestSnapshotEnv: masked and file variables, and any value carrying a
// secret, stay out of a snapshot's environment.
func TestSnapshotEnv(t *testing.T) {
	job := &runnerapi.JobResponse{Token: "glcbt-secret-token",
		Variables: []runnerapi.Variable{{Key: "PASSWORD", Value: "hunter22", Masked: true}}}
	vars := []runnerapi.Variable{
		{Key: "CI_PROJECT_DIR", Value: "/builds/g/p"},
		{Key: "PASSWORD", Value: "hunter22", Masked: true},
		{Key: "DB_URL", Value: "postgres://u:hunter22@db/x"},
		{Key: "CLONE", Value: "https://gitlab-ci-token:glcbt-secret-token@host/g/p.git"},
		{Key: "KUBECONFIG", Value: "apiVersion: v1", File: true},
		{Key: "GREETING", Value: "hello"},
	}
	got := snapshotEnv(vars, job)
	if want := []string{"CI_PROJECT_DIR=/builds/g/p", "GREETING=hello"}; !slices.Equal(got, want) {
		t.Errorf("snapshotEnv = %q, want %q", got, want)
	}
}
