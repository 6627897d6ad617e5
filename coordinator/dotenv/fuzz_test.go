package dotenv

import (
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/artifacts/artifactstest"
)

func FuzzParseDotenvArtifact(f *testing.F) {
	for _, s := range []string{"A=1\n", "A=1\nB=2", "", "\n", "# c\n", "=x\n", " A = \"q\" \r\n", "\xEF\xBB\xBFA=1", "\xFF\xFEA\x00=\x001\x00", "A=\xff\n"} {
		f.Add([]byte(s), false)
		f.Add(artifactstest.GzipFiles(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, gzipped bool) {
		format := "raw"
		if gzipped {
			format = "gzip"
		}
		vars, err := Parse(data, format)
		if err != nil {
			return
		}
		if len(vars) > MaxVariables {
			t.Fatalf("%d variables", len(vars))
		}
		seen := map[string]bool{}
		for _, v := range vars {
			if keyProblem(v.Key) != "" || seen[v.Key] {
				t.Fatalf("bad or repeated key %q", v.Key)
			}
			seen[v.Key] = true
			if v.Value != strings.Trim(v.Value, space) || strings.Contains(v.Value, "\n") {
				t.Fatalf("value %q of %s not trimmed to one line", v.Value, v.Key)
			}
		}
	})
}
