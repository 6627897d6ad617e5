package ci

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

// render prints a pipeline compactly for golden files.
func render(p *Pipeline) string {
	var b strings.Builder
	fmt.Fprintf(&b, "created: %v %s\nstages: %s\n", p.Created, p.Reason, strings.Join(p.Stages, ", "))
	job := func(j *Job, excluded bool) {
		fmt.Fprintf(&b, "\njob %q stage=%s when=%s", j.Name, j.Stage, j.When)
		if excluded {
			b.WriteString(" (excluded)")
		}
		fmt.Fprintf(&b, " rules=%q\n", j.Rules.String())
		list := func(k string, v []string) {
			if len(v) > 0 {
				fmt.Fprintf(&b, "  %s: %q\n", k, v)
			}
		}
		if j.Image != nil {
			fmt.Fprintf(&b, "  image: %s\n", j.Image.Name)
		}
		list("before_script", j.BeforeScript)
		list("script", j.Script)
		list("after_script", j.AfterScript)
		list("tags", j.Tags)
		for _, v := range j.Variables {
			fmt.Fprintf(&b, "  var %s=%q\n", v.Key, v.Value)
		}
		if j.Scheduling == ScheduleDAG {
			fmt.Fprintf(&b, "  needs: %q\n", needNames(j))
		}
		list("dependencies", j.Dependencies)
		for _, c := range j.Cache {
			fmt.Fprintf(&b, "  cache key=%q paths=%q\n", c.Key, c.Paths)
		}
		if j.AllowFailure {
			b.WriteString("  allow_failure: true\n")
		}
		if j.Retry.Max > 0 {
			fmt.Fprintf(&b, "  retry: %d\n", j.Retry.Max)
		}
		if t := j.Trigger; t != nil {
			fmt.Fprintf(&b, "  trigger: project=%q branch=%q strategy=%q forward yaml=%v pipeline=%v\n",
				t.Project, t.Branch, t.Strategy, t.ForwardYAMLVariables, t.ForwardPipelineVariables)
			for _, inc := range t.Include {
				e, _ := json.Marshal(inc.Entry)
				fmt.Fprintf(&b, "  trigger include %s\n", e)
			}
		}
	}
	for _, j := range p.Jobs {
		job(j, false)
	}
	for _, j := range p.Excluded {
		job(j, true)
	}
	for _, w := range p.Warnings {
		fmt.Fprintf(&b, "\nwarning: %s\n", w)
	}
	return b.String()
}

func TestGolden(t *testing.T) {
	dirs, err := filepath.Glob("testdata/golden/*")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			env := branch("main")
			env.Predefined["CI_SERVER_FQDN"] = "gitlab.example.com"
			// _mirror holds the case's project, remote, template and
			// component files (DirResolver's layout); inputs.json the
			// pipeline inputs.
			res := NewDirResolver(os.DirFS(filepath.Join(dir, "_mirror")), "_mirror")
			env.Includes = res
			if b, err := os.ReadFile(filepath.Join(dir, "inputs.json")); err == nil {
				if err := json.Unmarshal(b, &env.Inputs); err != nil {
					t.Fatal(err)
				}
			}
			p, err := Compile(context.Background(), Source{FS: os.DirFS(dir)}, env)
			var got string
			if err != nil {
				got = "error:\n" + err.Error() + "\n"
			} else {
				got = render(p)
			}
			for _, u := range res.Unresolved() {
				got += fmt.Sprintf("\nunresolved include:%s %s (%s)\n", u.Kind, u.Include, u.Hint)
			}
			want := filepath.Join(dir, "want.txt")
			if *update {
				if err := os.WriteFile(want, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			b, err := os.ReadFile(want)
			if err != nil {
				t.Fatalf("%v (run go test -run TestGolden -update)", err)
			}
			if string(b) != got {
				t.Errorf("%s differs:\n--- got\n%s\n--- want\n%s", want, got, b)
			}
		})
	}
}
