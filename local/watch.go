package local

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/berthci/berth/coordinator/store"
)

// traceReader reads a job's log from an offset, wherever it is kept
// (joblog.Logs.Read: the store, or its archive).
type traceReader interface {
	Read(ctx context.Context, jobID, offset int64, w io.Writer) (int64, error)
}

// watcher streams job logs and draws the progress line as a pipeline
// changes. It is driven by one goroutine (the WatchPipeline callback).
type watcher struct {
	st       traceReader
	opts     Options
	offsets  map[int64]int64  // bytes of each job's trace already printed
	partial  map[int64][]byte // a trace's last line while it has no newline yet
	width    int              // longest job name, for aligned prefixes
	lastLine string
}

func newWatcher(st traceReader, opts Options) *watcher {
	return &watcher{st: st, opts: opts, offsets: map[int64]int64{}, partial: map[int64][]byte{}}
}

// update prints what changed: new log lines of every started job (a
// downstream pipeline's jobs named after their trigger job: "bridge ›
// job"), and the progress line.
func (w *watcher) update(ctx context.Context, t *tree) {
	var jobs []*store.Job
	for _, p := range t.all() {
		for _, j := range latestJobs(p.Jobs) {
			if n := len(p.prefix + j.Name); n > w.width {
				w.width = min(n, 40)
			}
			jobs = append(jobs, j)
		}
	}
	for _, p := range t.all() {
		for _, j := range latestJobs(p.Jobs) {
			if j.Status == store.StatusCreated || j.Status == store.StatusPending || j.Status == store.StatusSkipped ||
				j.Status == store.StatusManual || j.Status == store.StatusScheduled {
				continue
			}
			w.drain(ctx, p.prefix+j.Name, j, j.Status.Finished())
		}
	}
	w.progress(jobs, t.Pipeline)
}

// finish prints the rest of every trace.
func (w *watcher) finish(ctx context.Context, t *tree) {
	if t != nil {
		for _, p := range t.all() {
			for _, j := range latestJobs(p.Jobs) {
				w.drain(ctx, p.prefix+j.Name, j, true)
			}
		}
	}
	w.clearProgress()
}

// drain prints the trace bytes of j not printed yet, line by line, each
// after name; final flushes a last line without newline.
func (w *watcher) drain(ctx context.Context, name string, j *store.Job, final bool) {
	var buf bytes.Buffer
	if _, err := w.st.Read(ctx, j.ID, w.offsets[j.ID], &buf); err != nil {
		return
	}
	w.offsets[j.ID] += int64(buf.Len())
	data := append(w.partial[j.ID], buf.Bytes()...)
	w.partial[j.ID] = nil
	if len(data) == 0 {
		return
	}
	w.clearProgress()
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			if !final {
				w.partial[j.ID] = append([]byte(nil), data...)
				return
			}
			i = len(data)
		}
		line := data[:i]
		if i < len(data) {
			data = data[i+1:]
		} else {
			data = nil
		}
		if text, ok := w.render(line); ok {
			fmt.Fprintf(w.opts.Logs, "%-*s │ %s\n", w.width, name, text)
		}
	}
}

var (
	sectionMarker = regexp.MustCompile(`section_(?:start|end):\d+:[A-Za-z0-9_.\-\[\]=,]+\r?(?:\x1b\[0K)?`)
	ansiEscape    = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)
)

// render turns a trace line into terminal text: section markers removed,
// carriage-return overwrites resolved, colours kept only on a TTY. A line
// that was only a section marker is dropped.
func (w *watcher) render(line []byte) (string, bool) {
	s := strings.TrimRight(string(line), "\r")
	hadMarker := sectionMarker.MatchString(s)
	s = sectionMarker.ReplaceAllString(s, "")
	if i := strings.LastIndexByte(s, '\r'); i >= 0 {
		s = s[i+1:]
	}
	if !w.opts.TTY {
		s = ansiEscape.ReplaceAllString(s, "")
	} else if strings.Contains(s, "\x1b[") {
		s += "\x1b[0m"
	}
	if hadMarker && strings.TrimSpace(ansiEscape.ReplaceAllString(s, "")) == "" {
		return "", false
	}
	return s, true
}

// progress shows how many jobs are in which state.
func (w *watcher) progress(jobs []*store.Job, p *store.Pipeline) {
	if w.opts.Progress == nil || p == nil {
		return
	}
	counts := map[string]int{}
	var running []string
	for _, j := range jobs {
		switch {
		case j.Status == store.StatusRunning || j.Status == store.StatusCanceling:
			counts["running"]++
			running = append(running, j.Name)
		case j.Status.Finished():
			counts["done"]++
		default:
			counts["waiting"]++
		}
	}
	line := fmt.Sprintf("pipeline #%d %s: %d/%d done, %d running, %d waiting", p.ID, p.Status, counts["done"], len(jobs), counts["running"], counts["waiting"])
	if len(running) > 0 {
		line += " (" + strings.Join(running, ", ") + ")"
	}
	if line == w.lastLine {
		return
	}
	w.lastLine = line
	if w.opts.TTY {
		fmt.Fprintf(w.opts.Progress, "\r\x1b[2K%s", line)
	} else {
		fmt.Fprintln(w.opts.Progress, line)
	}
}

func (w *watcher) clearProgress() {
	if w.opts.Progress != nil && w.opts.TTY && w.lastLine != "" {
		fmt.Fprint(w.opts.Progress, "\r\x1b[2K")
		w.lastLine = ""
	}
}

// Summary writes the table of jobs: name, stage, status, duration; the
// jobs of a downstream pipeline follow their trigger job, indented.
func Summary(out io.Writer, r *Result) {
	type row struct {
		name string
		j    JobResult
	}
	var rows []row
	var walk func(r *Result, indent string)
	walk = func(r *Result, indent string) {
		for _, j := range r.Jobs {
			rows = append(rows, row{indent + j.Name, j})
			if d := j.Downstream; d != nil {
				rows = append(rows, row{indent + "  └ pipeline #" + strconv.FormatInt(d.PipelineID, 10), JobResult{Status: d.Status, Duration: d.Duration}})
				walk(d, indent+"    ")
			}
		}
	}
	walk(r, "")
	nameW, stageW := len("JOB"), len("STAGE")
	for _, rw := range rows {
		nameW, stageW = max(nameW, utf8.RuneCountInString(rw.name)), max(stageW, len(rw.j.Stage))
	}
	fmt.Fprintf(out, "%-*s  %-*s  %-18s  %s\n", nameW, "JOB", stageW, "STAGE", "STATUS", "DURATION")
	for _, rw := range rows {
		j := rw.j
		status := j.Status
		if j.Status == "failed" && j.AllowFailure {
			status = "failed (allowed)"
		}
		dur := "-"
		if j.Duration > 0 {
			dur = (time.Duration(j.Duration * float64(time.Second))).Round(10 * time.Millisecond).String()
		}
		pad := nameW - utf8.RuneCountInString(rw.name)
		fmt.Fprintf(out, "%s%s  %-*s  %-18s  %s\n", rw.name, strings.Repeat(" ", pad), stageW, j.Stage, status, dur)
	}
	fmt.Fprintf(out, "pipeline #%d %s in %s\n", r.PipelineID, r.Status, (time.Duration(r.Duration * float64(time.Second))).Round(10*time.Millisecond))
	if t := r.Tests; t != nil {
		fmt.Fprintf(out, "tests: %d passed, %d failed, %d errors, %d skipped in %s\n", t.Passed, t.Failed, t.Errors, t.Skipped,
			(time.Duration(t.Seconds * float64(time.Second))).Round(10*time.Millisecond))
		for i, f := range t.Failures {
			if i == maxListedFailures {
				fmt.Fprintf(out, "  … and %d more\n", len(t.Failures)-i)
				break
			}
			name := f.Name
			if f.Classname != "" {
				name = f.Classname + " › " + name
			}
			fmt.Fprintf(out, "  %-6s  %s › %s\n", f.Status, f.Suite, name)
		}
		for _, e := range t.SuiteErrors {
			fmt.Fprintf(out, "  report  %s\n", e)
		}
	}
}

// maxListedFailures is how many failed tests the summary names.
const maxListedFailures = 20
