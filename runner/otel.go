package runner

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/berthci/berth/internal/otlp"
	"github.com/berthci/berth/runnerapi"
)

// Job tracing (features.tracing, GitLab 18.x): when the payload asks, the
// runner traces the job with OpenTelemetry as GitLab's runner does — one
// span job_execution under the server's trace and parent span, with the
// attributes GitLab's runner sets — and, beyond it, one child span per
// stage of the job (prepare_executor, get_sources, step_script, …), so a
// trace shows where a job's time went. Spans go to every OTLP endpoint
// the payload names (http, https: OTLP/HTTP protobuf; grpc, grpcs:
// OTLP/gRPC) and are flushed when the job ends. Nothing of a job's
// variables, scripts or errors is put in a span: a stage that fails is
// marked as an error without its message (which may hold a URL with the
// job token).

const (
	tracerName           = "berth-runner"
	spanNameJobExecution = "job_execution" // GitLab runner's name

	spanAttrRunnerExecutor = attribute.Key("ci.runner.executor")
	spanAttrStage          = attribute.Key("ci.job.runner_stage")
)

// tracingFlushTimeout bounds how long a job's end waits for its spans to
// be exported.
const tracingFlushTimeout = 5 * time.Second

// jobTracer traces one job; the zero value (or nil) traces nothing.
type jobTracer struct {
	tp   *sdktrace.TracerProvider
	ctx  context.Context // holds the job span
	span trace.Span
}

// startJobTracing starts the job span when the payload asks for tracing
// and names an endpoint this runner can export to; nil otherwise.
func startJobTracing(log *slog.Logger, job *runnerapi.JobResponse, runnerID int64, executor, version string) *jobTracer {
	tf := job.Features.Tracing
	if tf == nil || len(tf.OTELEndpoints) == 0 {
		return nil
	}
	var opts []sdktrace.TracerProviderOption
	for _, e := range tf.OTELEndpoints {
		exp, err := otlpExporter(e)
		if err != nil {
			log.Warn("job tracing: endpoint not used", "endpoint", redactURL(e.URL), "err", err)
			continue
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	if len(opts) == 0 {
		return nil
	}
	opts = append(opts,
		sdktrace.WithSampler(sdktrace.AlwaysSample()), // the server asked for this job's trace
		sdktrace.WithResource(otlp.Resource(tracerName, version)))
	tp := sdktrace.NewTracerProvider(opts...)

	ctx := context.Background()
	traceID, terr := trace.TraceIDFromHex(tf.TraceID)
	spanID, serr := trace.SpanIDFromHex(tf.SpanParentID)
	if terr == nil && serr == nil {
		ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled, Remote: true,
		}))
	} else {
		log.Warn("job tracing: no valid trace and parent span id; the job's trace starts on its own", "trace_id", tf.TraceID, "span_parent_id", tf.SpanParentID)
	}
	vars := map[string]string{}
	for _, v := range job.Variables {
		if v.Key == "CI_PIPELINE_SOURCE" || v.Key == "CI_PIPELINE_ID" {
			vars[v.Key] = v.Value
		}
	}
	pipelineID := vars["CI_PIPELINE_ID"]
	if pipelineID == "" && job.JobInfo.PipelineID != 0 {
		pipelineID = strconv.FormatInt(job.JobInfo.PipelineID, 10)
	}
	ctx, span := tp.Tracer(tracerName).Start(ctx, spanNameJobExecution, trace.WithSpanKind(trace.SpanKindInternal))
	span.SetAttributes(
		otlp.AttrJobID.Int64(job.ID),
		otlp.AttrProjectID.Int64(job.JobInfo.ProjectID),
		otlp.AttrPipelineID.String(pipelineID),
		otlp.AttrPipelineSource.String(vars["CI_PIPELINE_SOURCE"]),
		otlp.AttrRunnerID.Int64(runnerID),
		spanAttrRunnerExecutor.String(executor),
		otlp.AttrJobName.String(job.JobInfo.Name),
		otlp.AttrJobStage.String(job.JobInfo.Stage),
	)
	return &jobTracer{tp: tp, ctx: ctx, span: span}
}

// stage starts the span of one stage of the job; end it with its outcome.
func (t *jobTracer) stage(name string) (end func(failed bool)) {
	if t == nil {
		return func(bool) {}
	}
	_, span := t.tp.Tracer(tracerName).Start(t.ctx, name, trace.WithAttributes(spanAttrStage.String(name)))
	return func(failed bool) {
		if failed {
			span.SetStatus(codes.Error, "stage failed")
		}
		span.End()
	}
}

// end ends the job span with the job's final state and exports what is
// left in the background (at most tracingFlushTimeout), so that a slow
// endpoint never delays the job's final update.
func (t *jobTracer) end(log *slog.Logger, state string) {
	if t == nil {
		return
	}
	t.span.SetAttributes(otlp.AttrJobStatus.String(state))
	if state != runnerapi.StateSuccess {
		t.span.SetStatus(codes.Error, "job "+state)
	}
	t.span.End()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
		defer cancel()
		if err := t.tp.Shutdown(ctx); err != nil {
			log.Warn("job tracing: exporting the job's spans failed", "err", err)
		}
	}()
}

// otlpExporter is an OTLP exporter for an endpoint of features.tracing.
func otlpExporter(e runnerapi.OTELEndpoint) (sdktrace.SpanExporter, error) {
	if e.Auth != nil {
		// GitLab's only kind, a Google-signed ID token, needs Google
		// credentials on the runner's host; Berth's runner has none to
		// offer and does not send spans unauthenticated.
		return nil, fmt.Errorf("authentication %q is not supported by Berth's runner", e.Auth.Type)
	}
	return otlp.Exporter(e.URL)
}
