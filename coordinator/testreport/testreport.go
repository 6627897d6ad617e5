// Package testreport reads JUnit XML reports (artifacts:reports:junit)
// into the test report of a pipeline, as GitLab's
// Gitlab::Ci::Parsers::Test::Junit and Gitlab::Ci::Reports::TestReport
// do: one suite per job (parallel jobs share one), its cases by status.
package testreport

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/berthci/berth/coordinator/artifacts"
)

// Statuses of a test case.
const (
	StatusSuccess = "success"
	StatusFailed  = "failed"
	StatusSkipped = "skipped"
	StatusError   = "error"
)

// statusOrder is the order cases are listed in: GitLab's STATUS_TYPES.
var statusOrder = []string{StatusError, StatusFailed, StatusSuccess, StatusSkipped}

// Limits bound what one report may cost to read.
const (
	// MaxText bounds a report's decompressed XML, all files together.
	MaxText = 64 << 20
	// MaxCases bounds the test cases of one report.
	MaxCases = 200_000
)

// Case is one test case.
type Case struct {
	Status        string
	Name          string
	Classname     string
	File          *string
	ExecutionTime float64
	// SystemOutput is the failure's, error's or skip's text, then the
	// case's system-out and system-err; nil for a success.
	SystemOutput *string
	// Attachment is the path a failed case's system-out names with
	// [[ATTACHMENT|path]] (a screenshot), relative to the job's
	// artifacts.
	Attachment string
	// SuiteName is the XML testsuite the case came from.
	SuiteName string
	// JobID is the job whose report it is in (set by the caller).
	JobID int64
}

// Suite is the cases of one job (or of the parallel jobs of one name).
type Suite struct {
	Name      string
	TotalTime float64
	Cases     []Case
	// Error says why a report of the suite could not be read; its cases
	// are then not shown.
	Error string
	// JobIDs are the jobs whose reports make the suite.
	JobIDs []int64
}

// Counts are the cases of a suite or a report by status.
type Counts struct {
	Total, Success, Failed, Skipped, Error int
}

// Count counts the suite's cases: none when a report of it could not be
// read, as GitLab counts (its cases are not shown either).
func (s *Suite) Count() Counts {
	var c Counts
	if s.Error != "" {
		return c
	}
	for _, tc := range s.Cases {
		c.Total++
		switch tc.Status {
		case StatusSuccess:
			c.Success++
		case StatusFailed:
			c.Failed++
		case StatusSkipped:
			c.Skipped++
		case StatusError:
			c.Error++
		}
	}
	return c
}

// Sum is the counts and the time of suites together.
func Sum(suites []*Suite) (Counts, float64) {
	var c Counts
	var t float64
	for _, s := range suites {
		n := s.Count()
		c.Total += n.Total
		c.Success += n.Success
		c.Failed += n.Failed
		c.Skipped += n.Skipped
		c.Error += n.Error
		t += s.TotalTime
	}
	return c, t
}

// Done is called once every report of the suite was read: a case given
// twice with one status (same suite, class and name: GitLab's
// TestCase#key) counts once,
// the last one read, as in GitLab (a test rerun that then passed counts
// once failed and once passed); the cases are ordered as GitLab lists
// them: errors, failures, successes, skips, each slowest first.
func (s *Suite) Done() {
	type key struct{ status, suite, class, name string }
	at := map[key]int{}
	kept := s.Cases[:0]
	for _, tc := range s.Cases {
		k := key{tc.Status, tc.SuiteName, tc.Classname, tc.Name}
		if i, ok := at[k]; ok {
			kept[i] = tc
			continue
		}
		at[k] = len(kept)
		kept = append(kept, tc)
	}
	s.Cases = kept
	slices.SortStableFunc(s.Cases, func(a, b Case) int {
		if d := slices.Index(statusOrder, a.Status) - slices.Index(statusOrder, b.Status); d != 0 {
			return d
		}
		switch {
		case a.ExecutionTime > b.ExecutionTime:
			return -1
		case a.ExecutionTime < b.ExecutionTime:
			return 1
		}
		return 0
	})
}

// SuiteName is the suite a job's report belongs to: its name, without
// the " 2/5" of a parallel job (GitLab's test_suite_name; a matrix job
// keeps its whole name).
func SuiteName(jobName string) string {
	if m := parallelSuffix.FindStringIndex(jobName); m != nil {
		return jobName[:m[0]]
	}
	return jobName
}

var parallelSuffix = regexp.MustCompile(` \d+/\d+$`)

var attachmentTag = regexp.MustCompile(`\[\[ATTACHMENT\|([^\[\]|]+?)\]\]`)

// ReadArtifact adds a stored report of a format (gzip, as the runner
// uploads it, one member per file; or raw) to a suite. A report that
// cannot be read sets the suite's Error (its cases are then not shown,
// as GitLab) and is not an error of the call.
func ReadArtifact(s *Suite, data []byte, format string) {
	if err := readArtifact(s, data, format); err != nil && s.Error == "" {
		s.Error = err.Error()
	}
}

func readArtifact(s *Suite, data []byte, format string) error {
	files, err := artifacts.ReportFiles(data, format, MaxText)
	if err != nil {
		return fmt.Errorf("JUnit data parsing failed: %v", err)
	}
	for _, f := range files {
		if err := parse(s, f); err != nil {
			return err
		}
	}
	return nil
}

// node is an element while it is open.
type node struct {
	name  string
	attrs map[string]string
	// What a testcase collects from its children.
	tc                     *Case
	failure, errText, skip *string
	systemOut, systemErr   *string
	text                   strings.Builder
}

// parse reads one JUnit XML document into s: the test cases of a
// <testsuite> root, or of a <testsuites> root and the <testsuite>
// elements in it, nested ones included (PHPUnit), as GitLab does.
func parse(s *Suite, data []byte) error {
	dec := xml.NewDecoder(bytes.NewReader(data))
	dec.Strict = true
	dec.CharsetReader = func(charset string, in io.Reader) (io.Reader, error) {
		if strings.EqualFold(charset, "utf-8") || strings.EqualFold(charset, "us-ascii") {
			return in, nil
		}
		return nil, fmt.Errorf("charset %s is not supported", charset)
	}
	var (
		stack      []*node
		suiteTimes float64
		caseTimes  float64
		rootTime   = -1.0
		sawRoot    bool
	)
	// counts says whether a testcase under the open elements is one:
	// every ancestor a testsuite, but the root, which may be testsuites.
	counts := func() bool {
		if len(stack) == 0 {
			return false
		}
		for i, n := range stack {
			if n.name != "testsuite" && !(i == 0 && n.name == "testsuites") {
				return false
			}
		}
		return true
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("JUnit XML parsing failed: %v", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			n := &node{name: t.Name.Local, attrs: map[string]string{}}
			for _, a := range t.Attr {
				n.attrs[a.Name.Local] = a.Value
			}
			if !sawRoot {
				sawRoot = true
				if v, ok := n.attrs["time"]; ok && n.name == "testsuites" {
					rootTime = rubyFloat(v)
				}
			}
			// The suites whose times count: the root, or the root
			// testsuites' own (GitLab's collect_all_testsuites).
			if n.name == "testsuite" && (len(stack) == 0 || len(stack) == 1 && stack[0].name == "testsuites") {
				suiteTimes += rubyFloat(n.attrs["time"])
			}
			if n.name == "testcase" && counts() {
				parent := stack[len(stack)-1]
				name, ok := parent.attrs["name"]
				if !ok {
					name = s.Name
				}
				cname, ok := n.attrs["name"]
				if !ok {
					cname = "(No name)"
				}
				n.tc = &Case{Name: cname, Classname: n.attrs["classname"], ExecutionTime: rubyFloat(n.attrs["time"]), SuiteName: name}
				if f, ok := n.attrs["file"]; ok {
					n.tc.File = &f
				}
				caseTimes += n.tc.ExecutionTime
			}
			stack = append(stack, n)
		case xml.CharData:
			if len(stack) > 0 {
				top := stack[len(stack)-1]
				if top.text.Len() < MaxText {
					top.text.Write(t)
				}
			}
		case xml.EndElement:
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if len(stack) > 0 {
				if p := stack[len(stack)-1]; p.tc != nil {
					text := strings.TrimSpace(n.text.String())
					if text == "" {
						text = n.attrs["message"]
					}
					switch n.name {
					case "failure":
						p.failure = &text
					case "error":
						p.errText = &text
					case "skipped":
						p.skip = &text
					case "system-out":
						p.systemOut = &text
					case "system-err":
						p.systemErr = &text
					}
				}
			}
			if n.tc != nil {
				finish(n)
				if len(s.Cases) >= MaxCases {
					return fmt.Errorf("JUnit data parsing failed: number of test cases exceeded the limit of %d", MaxCases)
				}
				s.Cases = append(s.Cases, *n.tc)
			}
		}
	}
	if !sawRoot {
		return errors.New("JUnit XML parsing failed: the document is empty")
	}
	switch {
	case rootTime >= 0:
		s.TotalTime += rootTime
	case suiteTimes > 0:
		s.TotalTime += suiteTimes
	default:
		s.TotalTime += caseTimes
	}
	return nil
}

// finish sets a testcase's status and output from its children.
func finish(n *node) {
	tc := n.tc
	var out []string
	add := func(s *string, label string) {
		if s != nil {
			out = append(out, label+*s)
		}
	}
	switch {
	case n.failure != nil:
		tc.Status = StatusFailed
		out = append(out, *n.failure)
	case n.errText != nil:
		tc.Status = StatusError
		out = append(out, *n.errText)
	case n.skip != nil:
		tc.Status = StatusSkipped
		tc.SystemOutput = n.skip
		return
	default:
		tc.Status = StatusSuccess
		return
	}
	add(n.systemOut, "System Out:\n\n")
	add(n.systemErr, "System Err:\n\n")
	joined := strings.Join(out, "\n\n")
	tc.SystemOutput = &joined
	if n.systemOut != nil {
		if m := attachmentTag.FindStringSubmatch(*n.systemOut); m != nil {
			tc.Attachment = m[1]
		}
	}
}

// rubyFloat reads a number as Ruby's String#to_f does: the longest
// leading decimal number, 0 without one.
func rubyFloat(s string) float64 {
	s = strings.TrimSpace(s)
	end := 0
	for end < len(s) && strings.IndexByte("+-0123456789.eE_", s[end]) >= 0 {
		end++
	}
	for ; end > 0; end-- {
		if f, err := strconv.ParseFloat(strings.ReplaceAll(s[:end], "_", ""), 64); err == nil {
			return f
		}
	}
	return 0 // also what overflows: a time that is no number JSON can carry
}
