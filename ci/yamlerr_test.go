package ci

import (
	"strings"
	"testing"

	"github.com/berthci/berth/internal/testenv"
)

// brokenYAML are files neither Berth nor GitLab can read, each with the
// line and column of the character the parser stops at.
// psychDiffers marks a file Psych refuses in other words: the Go port of
// libyaml and libyaml itself stop at different places.
var brokenYAML = []struct {
	in           string
	line, col    int
	psychDiffers bool
}{
	{"job:\n  script: echo\n  artifacts:\n    paths:\n      - \"${DIR}\"/meson-logs/*.txt\n    when: always\n", 5, 17, false},
	{"foo: [\n", 2, 1, false},
	{"a: [1, 2\nb: 3\n", 2, 2, false},
	{"a: {x: 1\n", 2, 1, false},
	{"a: b: c\n", 1, 5, false},
	{"a:\n  - x\n  y: 1\n", 3, 3, false},
	{"a:\n\t- x\n", 2, 1, false},
	{"a: 'unterminated\n", 2, 1, false},
	{"a: \"x\n", 2, 1, false},
	{"a: @x\n", 1, 4, false},
	{"a: *\n", 1, 5, false},
	{"a: !<x\n", 1, 7, false},
	{"job:\n  script:\n    - \"echo a\n  stage: test\n", 5, 1, false},
	{"a: 1\n b: 2\n", 2, 3, false},
	{"- a\nb: c\n", 2, 1, false},
	{"%YAML 1.1\n%YAML 1.1\n---\na: 1\n", 2, 1, false},
	{"a: `x`\n", 1, 4, false},
	{"a:\n  b: 1\n c: 2\n", 3, 2, false},
	{"key: value\n---\n- x\n...\n}\n", 5, 1, true},
}

// TestYAMLSyntaxErrors: a YAML syntax error is reported where the parser
// stopped, with libyaml's words and the place of the construct it was in.
func TestYAMLSyntaxErrors(t *testing.T) {
	for _, c := range brokenYAML {
		d := &diag{}
		parseYAML(".gitlab-ci.yml", []byte(c.in), d, Limits{}.withDefaults())
		if len(d.errs) != 1 {
			t.Errorf("%q: errors %v, want one", c.in, d.errs)
			continue
		}
		if p := d.errs[0].Pos; p.Line != c.line || p.Col != c.col {
			t.Errorf("%q: at %d:%d, want %d:%d (%s)", c.in, p.Line, p.Col, c.line, c.col, d.errs[0].Msg)
		}
	}
}

// TestYAMLSyntaxErrorsAgainstRuby: the message is Psych's, which is what
// GitLab shows for the same file (without its "(<unknown>): "): the
// problem, and the construct it was in with where that began.
func TestYAMLSyntaxErrorsAgainstRuby(t *testing.T) {
	ruby := testenv.LookPath(t, "ruby")
	var inputs []string
	for _, c := range brokenYAML {
		inputs = append(inputs, c.in)
	}
	lines := askRuby(t, ruby, inputs, `
  begin
    YAML.load_stream(s)
    puts "ok"
  rescue Psych::SyntaxError => e
    puts e.context ? "#{e.problem} #{e.context} at line #{e.line} column #{e.column}" : e.problem
  end`)
	for i, want := range lines {
		if brokenYAML[i].psychDiffers {
			continue
		}
		d := &diag{}
		parseYAML(".gitlab-ci.yml", []byte(inputs[i]), d, Limits{}.withDefaults())
		if len(d.errs) != 1 {
			t.Errorf("%q: errors %v, want one", inputs[i], d.errs)
			continue
		}
		if got := strings.TrimPrefix(d.errs[0].Msg, "invalid YAML: "); got != want {
			t.Errorf("%q:\n Berth %s\n Ruby  %s", inputs[i], got, want)
		}
	}
}
