// Package tracing traces pipelines with OpenTelemetry (docs/tracing.md).
// With OTLP endpoints configured (berth server --otel-endpoint), every
// job handed out carries GitLab's features.tracing: the pipeline's trace
// id and the job's span id as parent, and the endpoints, so the runner
// (Berth's, or GitLab's from 18.x) exports its job_execution span under
// it. When a pipeline finishes, the coordinator exports the rest of the
// trace: a pipeline span at the root and one span per job, from the time
// it was queued to the time it finished, which the runner's spans nest in.
//
// Ids are derived, not stored: the SHA-256 of the external URL (one per
// installation, shared by its replicas) with the pipeline's or job's id,
// so any replica hands out the ids the engine exports later.
package tracing

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/berthci/berth/coordinator/graph"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/internal/otlp"
	"github.com/berthci/berth/runnerapi"
)

const tracerName = "berth-coordinator"

// Attribute keys of the coordinator's own (the shared ones are otlp's).
const (
	attrPipelineStatus = attribute.Key("ci.pipeline.status")
	attrRef            = attribute.Key("ci.commit.ref")
	attrSha            = attribute.Key("ci.commit.sha")
	attrFailureReason  = attribute.Key("ci.job.failure_reason")
	attrQueued         = attribute.Key("ci.job.queued_duration_seconds")
	attrRetried        = attribute.Key("ci.job.retried")
)

// Tracer hands out trace context and exports finished pipelines. A nil
// *Tracer traces nothing.
type Tracer struct {
	salt      string
	endpoints []runnerapi.OTELEndpoint
	tp        *sdktrace.TracerProvider
	store     store.Store
	log       *slog.Logger
	wg        sync.WaitGroup
}

// New returns a Tracer exporting to endpoints (nil when there are none).
// externalURL salts the ids.
func New(externalURL string, endpoints []string, st store.Store, log *slog.Logger) (*Tracer, error) {
	if len(endpoints) == 0 {
		return nil, nil
	}
	version := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithIDGenerator(idGenerator{}), sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithResource(otlp.Resource(tracerName, version))}
	t := &Tracer{salt: externalURL, store: st, log: log}
	for _, e := range endpoints {
		exp, err := otlp.Exporter(e)
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
		t.endpoints = append(t.endpoints, runnerapi.OTELEndpoint{URL: e})
	}
	t.tp = sdktrace.NewTracerProvider(opts...)
	return t, nil
}

// derive is 8 or 16 bytes of the SHA-256 of the salt, a kind and an id;
// never all zero (which OpenTelemetry reads as no id).
func (t *Tracer) derive(kind string, id int64, n int) []byte {
	sum := sha256.Sum256([]byte(t.salt + "\x00" + kind + "\x00" + strconv.FormatInt(id, 10)))
	b := sum[:n]
	for _, c := range b {
		if c != 0 {
			return b
		}
	}
	b[n-1] = 1
	return b
}

// TraceID is the trace of a pipeline.
func (t *Tracer) TraceID(pipelineID int64) trace.TraceID {
	return trace.TraceID(t.derive("trace", pipelineID, 16))
}

// PipelineSpanID is the root span of a pipeline's trace.
func (t *Tracer) PipelineSpanID(pipelineID int64) trace.SpanID {
	return trace.SpanID(t.derive("pipeline", pipelineID, 8))
}

// JobSpanID is a job's span, the parent of the runner's.
func (t *Tracer) JobSpanID(jobID int64) trace.SpanID {
	return trace.SpanID(t.derive("job", jobID, 8))
}

// JobTracing is features.tracing for a job handed out: nil outside a
// pipeline or without a Tracer.
func (t *Tracer) JobTracing(j *store.Job) *runnerapi.JobTracing {
	if t == nil || j.PipelineID == 0 {
		return nil
	}
	tid, sid := t.TraceID(j.PipelineID), t.JobSpanID(j.ID)
	return &runnerapi.JobTracing{TraceID: hex.EncodeToString(tid[:]), SpanParentID: hex.EncodeToString(sid[:]),
		OTELEndpoints: append([]runnerapi.OTELEndpoint(nil), t.endpoints...)}
}

// PipelineFinished exports the trace of a pipeline that finished, in the
// background. A pipeline that finishes again (after a retry) is exported
// again, with the same ids.
func (t *Tracer) PipelineFinished(pipelineID int64) {
	if t == nil {
		return
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := t.export(ctx, pipelineID); err != nil {
			t.log.Warn("tracing: exporting a pipeline failed", "pipeline_id", pipelineID, "err", err)
		}
	}()
}

func (t *Tracer) export(ctx context.Context, pipelineID int64) error {
	p, err := t.store.GetPipeline(ctx, pipelineID)
	if err != nil {
		return err
	}
	jobs, err := t.store.ListJobs(ctx, store.JobFilter{PipelineID: pipelineID})
	if err != nil {
		return err
	}
	tr := t.tp.Tracer(tracerName)
	tid := t.TraceID(p.ID)
	end := p.FinishedAt
	if end.IsZero() {
		end = p.UpdatedAt
	}
	pctx := withIDs(ctx, tid, t.PipelineSpanID(p.ID))
	pctx, ps := tr.Start(pctx, "pipeline", trace.WithNewRoot(), trace.WithTimestamp(p.CreatedAt),
		trace.WithAttributes(otlp.AttrPipelineID.Int64(p.ID), otlp.AttrProjectID.Int64(p.ProjectID), otlp.AttrPipelineSource.String(p.Source),
			attrRef.String(p.Ref), attrSha.String(p.Sha), attrPipelineStatus.String(string(p.Status))))
	for _, j := range jobs {
		if !j.Status.Finished() || j.FinishedAt.IsZero() {
			continue
		}
		start := j.QueuedSince()
		if start.IsZero() || start.After(j.FinishedAt) {
			start = j.FinishedAt
		}
		attrs := []attribute.KeyValue{otlp.AttrJobID.Int64(j.ID), otlp.AttrJobName.String(j.Name), otlp.AttrJobStage.String(j.Stage),
			otlp.AttrJobStatus.String(string(j.Status)), attrRetried.Bool(j.Retried)}
		if j.FailureReason != "" {
			attrs = append(attrs, attrFailureReason.String(j.FailureReason))
		}
		if j.RunnerID != 0 {
			attrs = append(attrs, otlp.AttrRunnerID.Int64(j.RunnerID))
		}
		if !j.StartedAt.IsZero() && j.StartedAt.After(start) {
			attrs = append(attrs, attrQueued.Float64(j.StartedAt.Sub(start).Seconds()))
		}
		_, js := tr.Start(withIDs(pctx, tid, t.JobSpanID(j.ID)), "job "+j.Name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
		if j.Status == store.StatusFailed && !graph.Decode(j.Graph).AllowFailure {
			js.SetStatus(codes.Error, "job failed")
		}
		js.End(trace.WithTimestamp(j.FinishedAt))
	}
	if p.Status == store.StatusFailed {
		ps.SetStatus(codes.Error, "pipeline failed")
	}
	ps.End(trace.WithTimestamp(end))
	// A pipeline's trace goes out whole, now, rather than on the
	// batcher's schedule.
	return t.tp.ForceFlush(ctx)
}

// Close exports what is left, within ctx.
func (t *Tracer) Close(ctx context.Context) error {
	if t == nil {
		return nil
	}
	t.wg.Wait()
	if err := t.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flushing spans: %w", err)
	}
	return nil
}

// The spans the coordinator exports have the ids it handed out: the id
// generator takes them from the context.
type idsKey struct{}

type ids struct {
	trace trace.TraceID
	span  trace.SpanID
}

func withIDs(ctx context.Context, tid trace.TraceID, sid trace.SpanID) context.Context {
	return context.WithValue(ctx, idsKey{}, ids{tid, sid})
}

type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if v, ok := ctx.Value(idsKey{}).(ids); ok {
		return v.trace, v.span
	}
	var tid trace.TraceID
	_, _ = rand.Read(tid[:])
	return tid, idGenerator{}.NewSpanID(ctx, tid)
}

func (idGenerator) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if v, ok := ctx.Value(idsKey{}).(ids); ok {
		return v.span
	}
	var sid trace.SpanID
	_, _ = rand.Read(sid[:])
	return sid
}
