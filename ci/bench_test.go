package ci

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// BenchmarkCompile1000Jobs compiles a file of 1,000 jobs with variables
// and rules: the cost of reading a large .gitlab-ci.yml (every key goes
// through the YAML loader's checks).
func BenchmarkCompile1000Jobs(b *testing.B) {
	var sb strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&sb, "job-%d:\n  stage: test\n  image: golang\n  variables:\n    GOFLAGS: -mod=mod\n    CGO_ENABLED: 0\n  script:\n    - make\n  rules:\n    - if: $X == \"y\"\n      when: always\n", i)
	}
	src := Source{FS: files(".gitlab-ci.yml", sb.String())}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(context.Background(), src, Env{}); err != nil {
			b.Fatal(err)
		}
	}
}
