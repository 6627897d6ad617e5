// Package otlp builds OpenTelemetry trace exporters for the OTLP
// endpoints GitLab's job tracing names (features.tracing of the job
// payload): http and https for OTLP over HTTP (protobuf), grpc and grpcs
// for OTLP over gRPC. The runner and the coordinator both export with it.
package otlp

import (
	"context"
	"fmt"
	"net/url"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// Span attributes of CI jobs, named as GitLab's runner names them; the
// runner's and the coordinator's spans share them.
const (
	AttrJobID          = attribute.Key("ci.job.id")
	AttrJobName        = attribute.Key("ci.job.name")
	AttrJobStage       = attribute.Key("ci.job.stage")
	AttrJobStatus      = attribute.Key("ci.job.status")
	AttrProjectID      = attribute.Key("ci.project.id")
	AttrPipelineID     = attribute.Key("ci.pipeline.id")
	AttrPipelineSource = attribute.Key("ci.pipeline.source")
	AttrRunnerID       = attribute.Key("ci.runner.id")
)

// Check reports whether rawURL is an endpoint Exporter can export to.
func Check(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return fmt.Errorf("OTLP endpoint %q: not an absolute URL", rawURL)
	}
	switch u.Scheme {
	case "http", "https", "grpc", "grpcs":
		return nil
	}
	return fmt.Errorf("OTLP endpoint %q: scheme %q is not http, https, grpc or grpcs", rawURL, u.Scheme)
}

// Exporter is an exporter to the endpoint rawURL, as GitLab's runner
// reads it: for http(s), the URL's path is where spans are posted (none:
// OTLP's /v1/traces); for grpc(s), the path is ignored. It connects
// lazily.
func Exporter(rawURL string) (sdktrace.SpanExporter, error) {
	if err := Check(rawURL); err != nil {
		return nil, err
	}
	u, _ := url.Parse(rawURL)
	var c otlptrace.Client
	switch u.Scheme {
	case "http", "https":
		o := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host)}
		if u.Path != "" && u.Path != "/" {
			o = append(o, otlptracehttp.WithURLPath(u.Path))
		}
		if u.Scheme == "http" {
			o = append(o, otlptracehttp.WithInsecure())
		}
		c = otlptracehttp.NewClient(o...)
	default:
		o := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(u.Host)}
		if u.Scheme == "grpc" {
			o = append(o, otlptracegrpc.WithInsecure())
		}
		c = otlptracegrpc.NewClient(o...)
	}
	return otlptrace.New(context.Background(), c)
}

// Resource names the exporting service.
func Resource(service, version string) *resource.Resource {
	return resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(service), semconv.ServiceVersion(version))
}
