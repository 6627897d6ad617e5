package coordinator

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/internal/otlp/otlptest"
)

// TestPipelineTracing: with an OTLP endpoint configured, each job handed
// out names its pipeline's trace and its own span as the parent of the
// runner's spans, and a finished pipeline is exported as a root span with
// one span per job under it, with those ids.
func TestPipelineTracing(t *testing.T) {
	sink := otlptest.New(t)

	e := newGitEnv(t, Config{OTELEndpoints: []string{sink.HTTPURL}})
	e.createProject(t, "p")
	tok := e.createRunner(restapi.CreateRunnerRequest{})
	e.pushFiles(t, "p", "main", map[string]string{".gitlab-ci.yml": "build:\n  stage: build\n  script: [make]\ntest:\n  script: [make test]\n"}, "-o", "ci.skip")
	pl := e.createPipeline(t, "p", "main")
	build := e.runJob(tok, "success", 0)
	test := e.runJob(tok, "failed", 1)
	for _, j := range []struct {
		name    string
		tracing bool
	}{{build.JobInfo.Name, build.Features.Tracing != nil}, {test.JobInfo.Name, test.Features.Tracing != nil}} {
		if !j.tracing {
			t.Fatalf("job %s was handed out without features.tracing", j.name)
		}
	}
	tr := build.Features.Tracing
	if tr.TraceID != test.Features.Tracing.TraceID || tr.SpanParentID == test.Features.Tracing.SpanParentID ||
		len(tr.OTELEndpoints) != 1 || tr.OTELEndpoints[0].URL != sink.HTTPURL {
		t.Fatalf("tracing of the two jobs: %+v and %+v", tr, test.Features.Tracing)
	}

	var pipeline *tracepb.Span
	jobs := map[string]*tracepb.Span{}
	deadline := time.Now().Add(20 * time.Second)
	for pipeline == nil || len(jobs) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("spans exported: pipeline %v, jobs %v", pipeline, jobs)
		}
		time.Sleep(20 * time.Millisecond)
		for _, sp := range sink.Spans("http") {
			switch {
			case sp.GetName() == "pipeline":
				pipeline = sp
			case bytes.HasPrefix([]byte(sp.GetName()), []byte("job ")):
				jobs[sp.GetName()] = sp
			}
		}
	}
	if hex.EncodeToString(pipeline.GetTraceId()) != tr.TraceID || len(pipeline.GetParentSpanId()) != 0 {
		t.Errorf("pipeline %d's span: trace %x parent %x, want the jobs' trace %s at the root", pl.ID, pipeline.GetTraceId(), pipeline.GetParentSpanId(), tr.TraceID)
	}
	if pipeline.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("a failed pipeline's span has status %v", pipeline.GetStatus())
	}
	for name, want := range map[string]string{"job build": tr.SpanParentID, "job test": test.Features.Tracing.SpanParentID} {
		js := jobs[name]
		if js == nil {
			t.Errorf("no span %q", name)
			continue
		}
		if hex.EncodeToString(js.GetSpanId()) != want || !bytes.Equal(js.GetParentSpanId(), pipeline.GetSpanId()) {
			t.Errorf("%s: span %x under %x, want %s under the pipeline's %x", name, js.GetSpanId(), js.GetParentSpanId(), want, pipeline.GetSpanId())
		}
	}
	if jobs["job test"].GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR || jobs["job build"].GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("job span statuses: build %v, test %v", jobs["job build"].GetStatus(), jobs["job test"].GetStatus())
	}
}

func TestTracingEndpointChecked(t *testing.T) {
	arts, err := artifacts.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{OTELEndpoints: []string{"ftp://collector:4318"}}, Options{Store: openTestStore(t, t.TempDir()), Artifacts: arts})
	if err == nil || !strings.Contains(err.Error(), `scheme "ftp"`) {
		t.Errorf("an ftp:// OTLP endpoint: %v, want an error naming the scheme", err)
	}
}
