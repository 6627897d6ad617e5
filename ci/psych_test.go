package ci

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"

	"github.com/berthci/berth/internal/testenv"
)

// psychCases are plain scalars with what Ruby 3.1's Psych (safe_load,
// symbols permitted, as GitLab loads CI files) and to_s make of them,
// recorded from Ruby.
var psychCases = []struct {
	in, want string
	kind     psychKind
}{
	{"3.10", "3.1", psychValue}, {"40_000_000", "40000000", psychValue}, {"0755", "493", psychValue},
	{"08", "08", psychString}, {"0x1F", "31", psychValue}, {"0b101", "5", psychValue}, {"1e5", "1e5", psychString},
	{"1.5e+3", "1500.0", psychValue}, {"1.e5", "1.e5", psychString}, {"1.", "1.0", psychValue}, {".5", "0.5", psychValue},
	{"+.5", "0.5", psychValue}, {"-.5", "-0.5", psychValue}, {".", ".", psychString}, {"1,000", "1000", psychValue},
	{"1:30", "5400", psychValue}, {"1:30:15", "5415", psychValue}, {"-1:30", "-1800", psychValue}, {"1:30.5", "5430.0", psychValue},
	{".inf", "Infinity", psychValue}, {"-.inf", "-Infinity", psychValue}, {".NaN", "NaN", psychValue}, {"+1", "1", psychValue},
	{"-0", "0", psychValue}, {"-0.0", "-0.0", psychValue}, {"00", "0", psychValue}, {"0_1", "1", psychValue}, {"12_", "12_", psychString},
	{"0x_", "0x_", psychError}, {"0x", "0x", psychString}, {":foo", "foo", psychValue}, {"::foo", ":foo", psychValue},
	{`:"a b"`, "a b", psychValue}, {"2024-01-31", "2024-01-31", psychDate}, {"2024-01-31 10:00:00", "2024-01-31 10:00:00", psychDate},
	{"1e16", "1e16", psychString}, {"1.0e+16", "1.0e+16", psychValue}, {"1234567890123456.0", "1.234567890123456e+15", psychValue},
	{"123456789012345.0", "123456789012345.0", psychValue}, {"0.0001", "0.0001", psychValue}, {"0.00001", "1.0e-05", psychValue},
	{"123456789012345678901234567890", "123456789012345678901234567890", psychValue}, {"1_0.5", "10.5", psychValue},
	{"0.1e-7", "1.0e-08", psychValue}, {"v1.2", "v1.2", psychString}, {"1.2.3", "1.2.3", psychString}, {"010", "8", psychValue},
	{"0o17", "0o17", psychString}, {"+0x1F", "31", psychValue}, {"1__0", "1__0", psychString}, {"0b_", "0b_", psychError},
	{"1234567890123456.7", "1234567890123456.8", psychValue}, {"1000000000000000.0", "1.0e+15", psychValue},
	{"100000000000000.5", "100000000000000.5", psychValue}, {"12345678901234567.5", "1.2345678901234568e+16", psychValue},
	{"1:60", "1:60", psychString}, {"1:5", "3900", psychValue}, {"99:59:59:59", "99:59:59:59", psychString}, {"latest", "latest", psychString},
}

func TestPsychScalar(t *testing.T) {
	for _, c := range psychCases {
		got, kind := psychScalar(c.in)
		if got != c.want || kind != c.kind {
			t.Errorf("psychScalar(%q) = %q, %v; want %q, %v", c.in, got, kind, c.want, c.kind)
		}
	}
}

// TestPsychScalarAgainstRuby compares psychScalar with Ruby's Psych on the
// recorded cases and on random scalars made of the characters numbers
// are written with.
func TestPsychScalarAgainstRuby(t *testing.T) {
	ruby := testenv.LookPath(t, "ruby")
	inputs := make([]string, 0, 6000)
	for _, c := range psychCases {
		inputs = append(inputs, c.in)
	}
	// Mostly numbers; then the letters of hex, binary, inf, nan, times.
	alphabets := []string{"0123456789012345678901234567890123456789._,:+-eExb", "0123456789abcdefxXbBoOinfINFaNT .:_,+-eEZ"}
	r := rand.New(rand.NewPCG(1, 2))
	// Long decimals, where Float#to_s turns from fixed to exponent.
	for range 500 {
		intDigits, fracDigits := 12+r.IntN(7), r.IntN(4)
		var b strings.Builder
		b.WriteByte(byte('1' + r.IntN(9)))
		for range intDigits - 1 {
			b.WriteByte(byte('0' + r.IntN(10)))
		}
		b.WriteByte('.')
		for range fracDigits {
			b.WriteByte(byte('0' + r.IntN(10)))
		}
		inputs = append(inputs, b.String())
	}
	for len(inputs) < cap(inputs) {
		alphabet := alphabets[len(inputs)%len(alphabets)]
		n := 1 + r.IntN(12)
		var b strings.Builder
		for range n {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		s := b.String()
		if s != strings.TrimSpace(s) {
			continue // not the same scalar once in a line
		}
		inputs = append(inputs, s)
	}
	answers := askRuby(t, ruby, inputs, `
  begin
    v = YAML.safe_load("v: #{s}", permitted_classes: [Symbol], permitted_symbols: [], aliases: true)["v"]
    puts JSON.generate([v.class.name, v.to_s])
  rescue Psych::DisallowedClass
    puts JSON.generate(["Date", s])
  rescue Psych::SyntaxError
    puts JSON.generate(["Syntax", s])
  rescue StandardError => e
    puts JSON.generate(["Error", e.class.name])
  end`)
	compared := 0
	for i, line := range answers {
		var res [2]string
		if err := json.Unmarshal([]byte(line), &res); err != nil {
			t.Fatalf("ruby's answer %q: %v", line, err)
		}
		s := inputs[i]
		got, kind := psychScalar(s)
		var want psychKind
		switch res[0] {
		case "String":
			want = psychString
		case "Integer", "Float", "Symbol":
			want = psychValue
		case "Date":
			want = psychDate
		case "Error":
			want = psychError
		default:
			continue // not a plain scalar (Syntax), or nil, true, false: the caller's
		}
		if kind != want || (want == psychValue || want == psychString) && got != res[1] {
			t.Errorf("%q: Berth %q (%v), Ruby %s %q", s, got, kind, res[0], res[1])
		}
		compared++
	}
	if compared < len(inputs)*9/10 {
		t.Fatalf("compared %d of %d scalars", compared, len(inputs))
	}
}

// psychWordInputs are Psych's boolean and null words in every case, and
// scalars that are nearly them.
func psychWordInputs() []string {
	in := []string{"", "~", "y", "n", "Y", "nul", "nulls", "onn", "of", "tru", "yess", "falsey", "~~", "_", "truE1"}
	for _, w := range []string{"yes", "true", "on", "no", "false", "off", "null"} {
		for mask := range 1 << len(w) {
			b := []byte(w)
			for i := range b {
				if mask&(1<<i) != 0 {
					b[i] -= 'a' - 'A'
				}
			}
			in = append(in, string(b))
		}
	}
	return in
}

func TestPsychWord(t *testing.T) {
	for in, want := range map[string]psychWordKind{"yes": wordTrue, "tRuE": wordTrue, "ON": wordTrue, "No": wordFalse,
		"fAlSe": wordFalse, "oFF": wordFalse, "null": wordNull, "NuLl": wordNull, "~": wordNull, "": wordNull, "y": wordNone,
		"nulls": wordNone, "truthy": wordNone, "1": wordNone} {
		if got := psychWord(in); got != want {
			t.Errorf("psychWord(%q) = %d, want %d", in, got, want)
		}
	}
	if b, ok := yaml11Bool(&node{kind: kScalar, tag: "!!str", str: "yEs", plain: true}); !ok || !b {
		t.Errorf("yaml11Bool(yEs) = %v, %v; Psych reads true", b, ok)
	}
	if _, ok := yaml11Bool(&node{kind: kScalar, tag: "!!str", str: "yEs"}); ok {
		t.Error("a quoted yEs is a boolean")
	}
}

// TestPsychKeyTypeAgainstRuby compares psychKeyType with what Ruby's Psych
// makes of the same plain mapping keys: the words in every case, the
// recorded scalars and a few names.
func TestPsychKeyTypeAgainstRuby(t *testing.T) {
	ruby := testenv.LookPath(t, "ruby")
	inputs := psychWordInputs()[1:] // a key of nothing is not a plain scalar
	for _, c := range psychCases {
		inputs = append(inputs, c.in)
	}
	inputs = append(inputs, "build", "1-build", "_x", "Build_1", "deploy:prod", "job 1", ".hidden",
		":build", `:"a b"`, ":'x'", ":1", "::x", `:":y"`, ":.hidden", ":true", `:"q"r"`, ".5", ".inf", ".nan", ".5e+3")
	lines := askRuby(t, ruby, inputs, `
  begin
    k = YAML.safe_load("#{s}: 1", permitted_classes: [Symbol], permitted_symbols: [], aliases: true).keys.first
    puts k.class.name + " " + k.to_s
  rescue Psych::DisallowedClass
    puts "Date"
  rescue StandardError
    puts "Error"
  end`)
	compared := 0
	for i, line := range lines {
		class, name, _ := strings.Cut(line, " ")
		var want keyType
		switch class {
		case "String", "Symbol":
			want = keyString
		case "TrueClass", "FalseClass":
			want = keyBool
		case "NilClass":
			want = keyNull
		case "Integer", "Float":
			want = keyNumber
		case "Date":
			want = keyDate
		default:
			continue // not a key Psych reads (a syntax error)
		}
		key, plain := psychKey(inputs[i], true)
		got := keyString
		if plain {
			got = psychKeyType(key)
		}
		if got != want {
			t.Errorf("key %q: Berth %s, Ruby %s", inputs[i], got, class)
		}
		if class == "Symbol" && key != name {
			t.Errorf("key %q: Berth names it %q, Ruby %q", inputs[i], key, name)
		}
		compared++
	}
	if compared < len(inputs)*9/10 {
		t.Fatalf("compared %d of %d keys", compared, len(inputs))
	}
}

// askRuby runs body, Ruby with yaml and json loaded, once for each input
// (as s), and returns the line it printed for each.
func askRuby(t *testing.T, ruby string, inputs []string, body string) []string {
	t.Helper()
	var in bytes.Buffer
	for _, s := range inputs {
		b, _ := json.Marshal(s)
		in.Write(append(b, '\n'))
	}
	cmd := exec.Command(ruby, "-ryaml", "-rjson", "-e", "STDIN.each_line do |l|\n  s = JSON.parse(l)\n"+body+"\nend")
	cmd.Stdin = &in
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ruby: %v", err)
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) != len(inputs) {
		t.Fatalf("ruby answered %d of %d inputs", len(lines), len(inputs))
	}
	return lines
}
