package runner

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"testing"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/internal/otlp/otlptest"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/runnerapi"
)

// tracingProxy proxies a coordinator and adds features.tracing to every
// job it hands out, as GitLab does when it wants a job traced.
func tracingProxy(t *testing.T, target string, tracing map[string]any) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(res *http.Response) error {
		if !strings.HasSuffix(res.Request.URL.Path, "/jobs/request") || res.StatusCode != http.StatusCreated {
			return nil
		}
		b, err := io.ReadAll(res.Body)
		if err != nil {
			return err
		}
		var job map[string]any
		if err := json.Unmarshal(b, &job); err != nil {
			return err
		}
		features, _ := job["features"].(map[string]any)
		if features == nil {
			features = map[string]any{}
		}
		features["tracing"] = tracing
		job["features"] = features
		b, _ = json.Marshal(job)
		res.Body = io.NopCloser(bytes.NewReader(b))
		res.ContentLength = int64(len(b))
		res.Header.Del("Content-Length")
		return nil
	}
	hs := httptest.NewServer(rp)
	t.Cleanup(hs.Close)
	return hs.URL
}

// TestJobTracing: a job whose payload asks for tracing is traced to every
// OTLP endpoint named (HTTP and gRPC): job_execution under the server's
// trace and parent span, with GitLab's runner's attributes, and a child
// span per stage; a failing stage is an error without its message; an
// endpoint needing authentication Berth's runner lacks is left out.
func TestJobTracing(t *testing.T) {
	sink := otlptest.New(t)
	httpURL, grpcURL := sink.HTTPURL, sink.GRPCURL
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	e := newE2E(t)
	proxy := tracingProxy(t, e.url, map[string]any{
		"trace_id": traceID, "span_parent_id": parentID,
		"otel_endpoints": []any{
			map[string]any{"url": httpURL},
			map[string]any{"url": grpcURL},
			map[string]any{"url": "https://otel.example.com", "auth": map[string]any{"type": "http_bearer_gcp_oidc", "http_bearer_gcp_oidc": map[string]any{"audience": "x"}}},
		},
	})
	_, _ = e.startRunnerWith(t.TempDir(), restapi.CreateRunnerRequest{RunnerType: "instance_type"}, func(rc *config.Runner) {
		rc.URL = proxy
	}, nil)
	spec := pushSpec("traced")
	spec.Steps = script("echo about to fail", "exit 3")
	id := e.enqueue(t, spec)
	if j := e.waitDone(t, id); j.Status != "failed" {
		t.Fatalf("job: %s\n%s", j.Status, e.trace(t, id))
	}
	for _, transport := range []string{"http", "grpc"} {
		// Spans are exported after the job's final update.
		waitFor(t, transport+" spans", func() bool {
			return slices.ContainsFunc(sink.Spans(transport), func(sp *tracepb.Span) bool { return sp.GetName() == "job_execution" })
		})
		spans := sink.Spans(transport)
		var job *tracepb.Span
		stages := map[string]*tracepb.Span{}
		for _, sp := range spans {
			if sp.GetName() == "job_execution" {
				job = sp
			} else {
				stages[sp.GetName()] = sp
			}
		}
		if job == nil {
			t.Fatalf("%s: no job_execution span among %d", transport, len(spans))
		}
		if hex.EncodeToString(job.GetTraceId()) != traceID || hex.EncodeToString(job.GetParentSpanId()) != parentID {
			t.Errorf("%s: job span in trace %x under %x, want %s under %s", transport, job.GetTraceId(), job.GetParentSpanId(), traceID, parentID)
		}
		attrs := map[string]string{}
		for _, kv := range job.GetAttributes() {
			v := kv.GetValue()
			switch {
			case v.GetStringValue() != "":
				attrs[kv.GetKey()] = v.GetStringValue()
			default:
				attrs[kv.GetKey()] = strings.TrimSpace(strings.Trim(v.String(), "int_value:"))
			}
		}
		if attrs["ci.job.status"] != "failed" || attrs["ci.runner.executor"] != "shell" || attrs["ci.job.name"] != "traced" {
			t.Errorf("%s: job span attributes %v", transport, attrs)
		}
		if job.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("%s: a failed job's span has status %v", transport, job.GetStatus())
		}
		step := stages["step_script"]
		if step == nil || !bytes.Equal(step.GetParentSpanId(), job.GetSpanId()) || step.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("%s: step_script span %v, want an error under the job span; stages %v", transport, step, keys(stages))
		}
		if step != nil && strings.Contains(step.GetStatus().GetMessage(), "exit") {
			t.Errorf("%s: the stage's error message reached the span: %q", transport, step.GetStatus().GetMessage())
		}
		if stages["prepare_executor"] == nil {
			t.Errorf("%s: no prepare_executor span; stages %v", transport, keys(stages))
		}
	}
	if p := sink.Paths(); p[0] != "/custom/traces" {
		t.Errorf("OTLP/HTTP path %q, want the endpoint's", p[0])
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// An endpoint the runner cannot export to is left out, never used without
// its authentication.
func TestOTLPEndpointsRefused(t *testing.T) {
	for _, e := range []runnerapi.OTELEndpoint{
		{URL: "https://otel.example.com", Auth: &runnerapi.OTELEndpointAuth{Type: "http_bearer_gcp_oidc"}},
		{URL: "ftp://otel.example.com"},
		{URL: "otel.example.com:4318"},
	} {
		if _, err := otlpExporter(e); err == nil {
			t.Errorf("%+v: an exporter was made", e)
		}
	}
	if _, err := otlpExporter(runnerapi.OTELEndpoint{URL: "grpcs://otel.example.com"}); err != nil {
		t.Errorf("grpcs endpoint: %v", err)
	}
}
