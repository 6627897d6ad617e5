package ci

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// FuzzInputs feeds arbitrary bytes to the spec: header and $[[ ]]
// interpolation. The input is a file with a header, included with inputs;
// after a line "#---" come pipeline inputs (K=V lines) and, after a second
// "#---", the include's inputs as a YAML flow mapping. The same file is
// also compiled as the main file with the pipeline inputs. Compile must
// never panic and must report configuration problems only as positioned
// errors.
func FuzzInputs(f *testing.F) {
	for _, s := range []string{
		"spec:\n  inputs:\n    a:\n---\nj:\n  script: [echo $[[ inputs.a ]]]\n#---\na=x\n#---\n{a: y}",
		"spec:\n  inputs:\n    n:\n      type: number\n      default: 2\n    t:\n      type: array\n      default: [a]\n---\nj:\n  parallel: $[[ inputs.n ]]\n  tags: $[[ inputs.t ]]\n  script: ['$[[ inputs.t ]]']\n#---\nn=3\n#---\n{n: 1.5, t: [b, c]}",
		"spec:\n  inputs:\n    s:\n      default: abc\n      regex: ^a\n      options: [abc, abd]\n---\n$[[ inputs.s | truncate(1,1) ]]:\n  script:\n    - $[[ inputs.s | expand_vars | posix_escape | truncate(0,2) ]]\n#---\n#---\n{s: abd}",
		"spec:\n  inputs:\n    b:\n      type: boolean\n      default: true\n---\nj:\n  allow_failure: $[[ inputs.b ]]\n  script: [x $[[ matrix.X ]] $[[ inputs.b | nope ]]]\n#---\nb=false\n#---\n{b: no}",
		"spec:\n---\nj:\n  script: [x]\n",
		"j:\n  script: [$[[ inputs.x ]]]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, rest, _ := bytes.Cut(data, []byte("\n#---\n"))
		kv, incInputs, _ := bytes.Cut(rest, []byte("\n#---\n"))
		inputs := map[string]any{}
		for _, line := range strings.Split(string(kv), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok && k != "" {
				inputs[k] = v
			}
		}
		in := strings.ReplaceAll(string(incInputs), "\n", " ")
		main := "include:\n  - local: tpl.yml\n    inputs: " + in + "\nok:\n  script: [x]\n"
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		check := func(fsysMain string, env Env) {
			fsys := files(".gitlab-ci.yml", fsysMain, "tpl.yml", string(file))
			env.Predefined = map[string]string{"CI_COMMIT_BRANCH": "main", "A": "x"}
			env.Limits = Limits{MaxNodes: 200_000, MaxJobs: 2000}
			_, err := Compile(ctx, Source{FS: fsys}, env)
			if err == nil {
				return
			}
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("non-configuration error: %v", err)
			}
			if len(list) == 0 {
				t.Fatal("empty ErrorList")
			}
			for _, e := range list {
				if e.Pos.File == "" || e.Pos.Line < 1 || e.Pos.Col < 1 || e.Msg == "" {
					t.Fatalf("error without a position: %#v", e)
				}
			}
		}
		check(main, Env{})
		check(string(file), Env{Inputs: inputs})
	})
}
