package dotenv

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/artifacts/artifactstest"
	"github.com/berthci/berth/runnerapi"
)

// kvVars is the variables of key, value pairs.
func kvVars(kv ...string) []runnerapi.Variable {
	var out []runnerapi.Variable
	for i := 0; i < len(kv); i += 2 {
		out = append(out, runnerapi.Variable{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func TestParseDotenvArtifact(t *testing.T) {
	var many strings.Builder
	for i := range MaxVariables + 1 {
		many.WriteString("K" + strings.Repeat("x", i) + "=v\n")
	}
	for _, tc := range []struct {
		name, text string
		want       []runnerapi.Variable
		line       int // of the error; -1 for no error
	}{
		{"simple", "BUILD_VERSION=1.2.3\n", kvVars("BUILD_VERSION", "1.2.3"), -1},
		{"no final newline", "A=1\nB=2", kvVars("A", "1", "B", "2"), -1},
		{"empty file", "", nil, -1},
		{"trimmed", "  A =  x y  \r\n\tB\t=\t\n", kvVars("A", "x y", "B", ""), -1},
		{"first equals splits", "URL=https://x/?a=b=c\n", kvVars("URL", "https://x/?a=b=c"), -1},
		{"quotes kept", "A=\"quoted\"\nB='single'\n", kvVars("A", `"quoted"`, "B", "'single'"), -1},
		{"variables not expanded", "A=$HOME\n", kvVars("A", "$HOME"), -1},
		{"last value, first place", "A=1\nB=2\nA=3\n", kvVars("A", "3", "B", "2"), -1},
		{"utf8 bom", "\xEF\xBB\xBFA=1\n", kvVars("A", "1"), -1},
		{"invalid utf8 replaced", "A=\xff\n", kvVars("A", "\uFFFD"), -1},
		{"lone CR is not a line break", "A=1\rB=2\n", kvVars("A", "1\rB=2"), -1},
		{"empty line", "A=1\n\nB=2\n", nil, 2},
		{"comment", "# a comment\nA=1\n", nil, 1},
		{"commented assignment", "A=1\n# B=2\n", nil, 2},
		{"no equals", "A=1\nB\n", nil, 2},
		{"blank key", "=1\n", nil, 1},
		{"bad key", "A=1\nMY-VAR=1\n", nil, 2},
		{"export prefix", "export A=1\n", nil, 1},
		{"unicode key", "É=1\n", nil, 1},
		{"long key", strings.Repeat("K", 256) + "=1\n", nil, 1},
		{"at the limit", many.String()[strings.Index(many.String(), "\n")+1:], nil, -1},
		{"too many", many.String(), nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, format := range []string{"gzip", "raw"} {
				data := []byte(tc.text)
				if format == "gzip" {
					data = artifactstest.GzipFiles(tc.text)
				}
				got, err := Parse(data, format)
				if tc.line < 0 {
					if err != nil {
						t.Fatalf("%s: %v", format, err)
					}
					if tc.want != nil && !reflect.DeepEqual(got, tc.want) {
						t.Fatalf("%s: got %+v, want %+v", format, got, tc.want)
					}
					continue
				}
				var de *Error
				if !errors.As(err, &de) || de.Line != tc.line {
					t.Fatalf("%s: error %v, want one at line %d", format, err, tc.line)
				}
			}
		})
	}
}

func TestParseDotenvArtifactGzip(t *testing.T) {
	// One gzip member a file (a report listing several files); lines
	// are counted in each.
	got, err := Parse(artifactstest.GzipFiles("A=1", "B=2\nA=3\n"), "gzip")
	want := []runnerapi.Variable{{Key: "A", Value: "3"}, {Key: "B", Value: "2"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, %v; want %+v", got, err, want)
	}
	var de *Error
	if _, err := Parse(artifactstest.GzipFiles("A=1\n", "B=2\nbad\n"), "gzip"); !errors.As(err, &de) || de.Line != 2 {
		t.Fatalf("error %v, want one at line 2", err)
	}
	// UTF-16LE, as PowerShell writes it.
	u := []byte{0xFF, 0xFE}
	for _, c := range "A=é\r\n" {
		u = append(u, byte(c), byte(c>>8))
	}
	if got, err := Parse(artifactstest.GzipFiles(string(u)), "gzip"); err != nil || len(got) != 1 || got[0].Value != "é" {
		t.Fatalf("utf-16: got %+v, %v", got, err)
	}
	for name, data := range map[string][]byte{
		"not gzip":         []byte("A=1\n"),
		"empty":            nil,
		"truncated":        artifactstest.GzipFiles("A=1\n")[:10],
		"trailing garbage": append(artifactstest.GzipFiles("A=1\n"), "junk"...),
		"bomb":             artifactstest.GzipFiles(strings.Repeat("A=1\n", maxText/4+1)),
	} {
		if _, err := Parse(data, "gzip"); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := Parse(artifactstest.GzipFiles("A=1\n"), "zip"); err == nil {
		t.Error("zip: no error")
	}
}

func TestWithDotenv(t *testing.T) {
	keys := func(vs []runnerapi.Variable) (s []string) {
		for _, v := range vs {
			s = append(s, v.Key)
		}
		return s
	}
	vars := []runnerapi.Variable{{Key: "yaml"}, {Key: "project"}, {Key: "pipeline"}}
	dotenv := []runnerapi.Variable{{Key: "dotenv"}}
	for high, want := range map[int][]string{
		0: {"yaml", "project", "pipeline", "dotenv"},
		2: {"yaml", "dotenv", "project", "pipeline"},
		3: {"dotenv", "yaml", "project", "pipeline"},
		9: {"dotenv", "yaml", "project", "pipeline"},
	} {
		if got := keys(Insert(slices.Clone(vars), high, dotenv)); !reflect.DeepEqual(got, want) {
			t.Errorf("high %d: %v, want %v", high, got, want)
		}
	}
	if got := Insert(vars, 1, nil); len(got) != 3 {
		t.Errorf("no dotenv: %v", got)
	}
}
