package testreport

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/berthci/berth/coordinator/artifacts/artifactstest"
)

// A go-junit-report / JUnit 5 style report: a testsuites root, suites
// with times, failures with messages and text, an error, a skip, output.
const mavenStyle = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites time="7.5">
  <testsuite name="pkg/a" tests="4" time="5">
    <testcase classname="pkg/a" name="TestOK" time="0.5"/>
    <testcase classname="pkg/a" name="TestSlowOK" time="3"/>
    <testcase classname="pkg/a" name="TestBad" time="1.5" file="a_test.go">
      <failure message="boom">a_test.go:12: want 3, got 4</failure>
      <system-out>log line
[[ATTACHMENT|shots/bad.png]]</system-out>
    </testcase>
    <testcase classname="pkg/a" name="TestMsgOnly" time="0">
      <failure message="only a message"/>
    </testcase>
  </testsuite>
  <testsuite name="pkg/b" time="2.5">
    <testcase classname="pkg/b" name="TestPanics" time="2"><error>panic: nil map</error><system-err>goroutine 1</system-err></testcase>
    <testcase classname="pkg/b" name="TestLater" time="0"><skipped message="not on CI"/></testcase>
  </testsuite>
</testsuites>`

func TestReadMavenStyle(t *testing.T) {
	s := &Suite{Name: "unit"}
	ReadArtifact(s, artifactstest.GzipFiles(mavenStyle), "gzip")
	s.Done()
	if s.Error != "" {
		t.Fatal(s.Error)
	}
	if c := s.Count(); c != (Counts{Total: 6, Success: 2, Failed: 2, Skipped: 1, Error: 1}) {
		t.Errorf("counts %+v", c)
	}
	if s.TotalTime != 7.5 {
		t.Errorf("total time %v, want the root's 7.5", s.TotalTime)
	}
	var order []string
	for _, c := range s.Cases {
		order = append(order, c.Name)
	}
	// errors, failures, successes, skips; slowest first within each.
	if got := strings.Join(order, " "); got != "TestPanics TestBad TestMsgOnly TestSlowOK TestOK TestLater" {
		t.Errorf("order %s", got)
	}
	bad := s.Cases[1]
	if bad.Status != StatusFailed || bad.File == nil || *bad.File != "a_test.go" || bad.Attachment != "shots/bad.png" || bad.SuiteName != "pkg/a" ||
		*bad.SystemOutput != "a_test.go:12: want 3, got 4\n\nSystem Out:\n\nlog line\n[[ATTACHMENT|shots/bad.png]]" {
		t.Errorf("failed case %+v output %q", bad, *bad.SystemOutput)
	}
	if o := s.Cases[2].SystemOutput; o == nil || *o != "only a message" {
		t.Errorf("a failure with only a message: %v", o)
	}
	if o := s.Cases[0].SystemOutput; o == nil || *o != "panic: nil map\n\nSystem Err:\n\ngoroutine 1" {
		t.Errorf("error output %q", *o)
	}
	if o := s.Cases[5].SystemOutput; s.Cases[5].Status != StatusSkipped || o == nil || *o != "not on CI" {
		t.Errorf("skipped %+v", s.Cases[5])
	}
	if s.Cases[3].SystemOutput != nil || s.Cases[3].File != nil {
		t.Errorf("a success has output or a file: %+v", s.Cases[3])
	}
	if _, err := json.Marshal(s.Cases); err != nil {
		t.Error(err)
	}
}

func TestReadShapes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		xml    string
		counts Counts
		time   float64
		suites string // the cases' suite names
	}{
		{"testsuite root, suite times", `<testsuite name="rspec" time="2.25"><testcase name="a" time="1"/><testcase name="b" time="1"/></testsuite>`,
			Counts{Total: 2, Success: 2}, 2.25, "rspec rspec"},
		{"no times but the cases'", `<testsuites><testsuite name="x"><testcase name="a" time="0.25"/><testcase name="b" time="1.5"/></testsuite></testsuites>`,
			Counts{Total: 2, Success: 2}, 1.75, "x x"},
		{"nested suites (PHPUnit)", `<testsuites><testsuite name="all"><testsuite name="Unit"><testsuite name="FooTest"><testcase name="t1" class="FooTest"/></testsuite></testsuite><testcase name="top"/></testsuite></testsuites>`,
			Counts{Total: 2, Success: 2}, 0, "FooTest all"},
		{"cases under the testsuites root", `<testsuites name="root"><testcase name="a"/></testsuites>`,
			Counts{Total: 1, Success: 1}, 0, "root"},
		{"a suite without a name: the job's", `<testsuite><testcase name="a"/></testsuite>`,
			Counts{Total: 1, Success: 1}, 0, "job"},
		{"cases outside suites do not count", `<report><testcase name="a"/><testsuite><testcase name="b"/></testsuite></report>`,
			Counts{}, 0, ""},
		{"testsuites nested in testsuites do not count", `<testsuites><testsuites><testsuite><testcase name="a"/></testsuite></testsuites></testsuites>`,
			Counts{}, 0, ""},
		{"a testcase in a testcase is not one", `<testsuite name="s"><testcase name="a"><testcase name="inner"/></testcase></testsuite>`,
			Counts{Total: 1, Success: 1}, 0, "s"},
		{"Ruby's to_f for times", `<testsuite name="s"><testcase name="a" time="1.5s"/><testcase name="b" time="abc"/><testcase name="c" time="1_000"/></testsuite>`,
			Counts{Total: 3, Success: 3}, 1001.5, "s s s"},
		{"the same case twice with one status counts once", `<testsuite name="s"><testcase classname="c" name="a"><failure/></testcase><testcase classname="c" name="a" file="other.go"><failure/></testcase><testcase classname="c" name="a"/></testsuite>`,
			Counts{Total: 2, Success: 1, Failed: 1}, 0, "s s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Suite{Name: "job"}
			ReadArtifact(s, []byte(tc.xml), "raw")
			s.Done()
			if s.Error != "" {
				t.Fatal(s.Error)
			}
			if c := s.Count(); c != tc.counts || s.TotalTime != tc.time {
				t.Errorf("counts %+v time %v, want %+v %v", c, s.TotalTime, tc.counts, tc.time)
			}
			var names []string
			for _, c := range s.Cases {
				names = append(names, c.SuiteName)
			}
			if got := strings.Join(names, " "); got != tc.suites {
				t.Errorf("suites %q, want %q", got, tc.suites)
			}
		})
	}
}

func TestReadSeveralFilesAndErrors(t *testing.T) {
	s := &Suite{Name: "job"}
	ReadArtifact(s, artifactstest.GzipFiles(`<testsuite time="1"><testcase name="a"/></testsuite>`, `<testsuite time="2"><testcase name="b"><failure/></testcase></testsuite>`), "gzip")
	s.Done()
	if c := s.Count(); s.Error != "" || c.Total != 2 || c.Failed != 1 || s.TotalTime != 3 {
		t.Errorf("two files in one gzip: %+v, time %v, error %q", c, s.TotalTime, s.Error)
	}
	// A report that breaks in its second file: the suite shows its error
	// and counts nothing, as GitLab's does.
	s = &Suite{Name: "job"}
	ReadArtifact(s, artifactstest.GzipFiles(`<testsuite><testcase name="a"/></testsuite>`, `<testsuite>`), "gzip")
	s.Done()
	if c := s.Count(); s.Error == "" || c != (Counts{}) {
		t.Errorf("a broken second file: error %q, counts %+v", s.Error, c)
	}
	if c, tm := Sum([]*Suite{s, {Name: "ok", TotalTime: 2, Cases: []Case{{Status: StatusSuccess}, {Status: StatusFailed}}}}); c != (Counts{Total: 2, Success: 1, Failed: 1}) || tm != 2 {
		t.Errorf("sum %+v %v", c, tm)
	}
	for name, data := range map[string][]byte{
		"not XML":        []byte("<testsuite><testcase"),
		"empty":          nil,
		"not gzip":       []byte("plain"),
		"bad second":     artifactstest.GzipFiles(`<testsuite/>`, `<<`),
		"other charset":  []byte(`<?xml version="1.0" encoding="ISO-8859-1"?><testsuite/>`),
		"mismatched end": []byte(`<testsuite></testsuites>`),
	} {
		s := &Suite{Name: "job"}
		format := "raw"
		if name == "not gzip" || name == "bad second" {
			format = "gzip"
		}
		ReadArtifact(s, data, format)
		if !strings.HasPrefix(s.Error, "JUnit ") {
			t.Errorf("%s: error %q", name, s.Error)
		}
	}
	s = &Suite{}
	ReadArtifact(s, []byte("<testsuite/>"), "zip")
	if s.Error == "" {
		t.Error("an unknown format was read")
	}
}

func TestSuiteName(t *testing.T) {
	for in, want := range map[string]string{"rspec 1/3": "rspec", "rspec 12/12": "rspec", "rspec": "rspec", "test: [a, 1/2]": "test: [a, 1/2]", "a 1/2 b": "a 1/2 b"} {
		if got := SuiteName(in); got != want {
			t.Errorf("SuiteName(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzReadArtifact: any bytes give a suite whose counts add up and whose
// figures JSON can carry, or an error; never a panic.
func FuzzReadArtifact(f *testing.F) {
	for _, s := range []string{mavenStyle, `<testsuite><testcase name="a" time="1e400"/></testsuite>`, "", "<x/>", `<testsuites><testcase/></testsuites>`} {
		f.Add([]byte(s), false)
		f.Add(artifactstest.GzipFiles(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, gzipped bool) {
		format := "raw"
		if gzipped {
			format = "gzip"
		}
		s := &Suite{Name: "job"}
		ReadArtifact(s, data, format)
		s.Done()
		c := s.Count()
		if c.Total != len(s.Cases) || c.Success+c.Failed+c.Skipped+c.Error != c.Total {
			t.Fatalf("counts %+v of %d cases", c, len(s.Cases))
		}
		if math.IsInf(s.TotalTime, 0) || math.IsNaN(s.TotalTime) {
			t.Fatalf("total time %v", s.TotalTime)
		}
		if _, err := json.Marshal(s.Cases); err != nil {
			t.Fatal(err)
		}
	})
}
