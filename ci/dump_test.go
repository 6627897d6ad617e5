package ci

import (
	"fmt"
	"testing"
)

var dumpCases = []string{
	"build:\n  script: make\n  scrpt: x\n",
	"build:\n  stage: tst\n  script: make\n",
	"build:\n  image: golang\n",
	"build:\n  script:\n    - echo: hi\n",
	"build:\n  script: make\n  when: sometimes\n",
	"build:\n  script: make\n  when: delayed\n",
	"build:\n  script: make\n  start_in: 5 minutes\n",
	"build:\n  script: make\n  timeout: forever\n",
	"build:\n  script: make\n  retry: 3\n",
	"build:\n  script: make\n  retry:\n    max: 1\n    when: [script_failure, exploded]\n",
	"test:\n  script: t\n  needs: [buld]\n",
	"build:\n  stage: deploy\n  script: b\ntest:\n  stage: test\n  script: t\n  needs: [build]\n",
	"a:\n  script: a\n  needs: [b]\nb:\n  script: b\n  needs: [a]\n",
	"test:\n  script: t\n  dependencies: [nope]\n",
	"test:\n  script: t\n  needs: [a]\n  dependencies: [b]\na:\n  stage: build\n  script: a\nb:\n  stage: build\n  script: b\n",
	"test:\n  script: t\n  rules:\n    - if: $A = \"x\"\n",
	"test:\n  script: t\n  rules:\n    - if: $A =~ /(/\n",
	"test:\n  extends: .missing\n  script: t\n",
	".a:\n  extends: .b\n.b:\n  extends: .a\ntest:\n  extends: .a\n  script: t\n",
	"test:\n  script: !reference [.nope, script]\n",
	"include: missing.yml\ntest:\n  script: t\n",
	"test:\n  script: t\n  only: [main]\n",
	"test:\n  trigger: other/project\n",
	"test:\n  script: t\n  variables:\n    FLAG: true\n",
	"stages: [build]\ntest:\n  script: t\n",
	"test:\n  script: t\n  parallel: 500\n",
	"test:\n  script: t\n  cache:\n    key: a/b\n",
	"test:\n  script: t\n  artifacts:\n    when: sometimes\n",
	"test:\n  script: t\n  allow_failure:\n    exit_codes: [one]\n",
	"test: [a, b]\n",
	".hidden:\n  script: x\n",
	"test:\n  script: t\n  rules:\n    - if: $A\n      when: delayed\n",
	"test:\n  script: t\n  services:\n    - name: redis\n      port: 1\n",
	"test:\n  script: t\n  environment:\n    name: prod\n    on_stop: stop\n",
	"foo: [\n",
	"test:\n  script: t\n  inherit:\n    default: [imagee]\n",
	"workflow:\n  rules:\n    - if: $A\n      when: manual\ntest:\n  script: t\n",
	"test:\n  script: t\n  coverage: 'Coverage: \\d+'\n",
}

func TestDump(t *testing.T) {
	for _, c := range dumpCases {
		_, err := compileYAML(t, c, Env{})
		fmt.Printf("----\n%s=> %v\n", c, err)
	}
}
