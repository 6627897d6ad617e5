package ssh

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/executor"
)

// firstByte notes when the first output arrived.
type firstByte struct {
	once sync.Once
	at   time.Time
}

func (f *firstByte) Write(p []byte) (int, error) {
	f.once.Do(func() { f.at = time.Now() })
	return len(p), nil
}

// BenchmarkStage is one stage on a prepared job (a warm connection, the
// helper on the host): first-line-ns is from Run to the script's first
// output line arriving, ns/op until Run returned (the stage's leftovers
// killed on the host).
func BenchmarkStage(b *testing.B) {
	needSSHD(b)
	p := newProvider(b, testOptions(b.TempDir()))
	ctx := context.Background()
	e, err := p.Create(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Cleanup(ctx)
	if _, err := e.Prepare(ctx, opts(0)); err != nil {
		b.Fatal(err)
	}
	var first time.Duration
	b.ResetTimer()
	for b.Loop() {
		var out firstByte
		start := time.Now()
		if err := e.Run(ctx, executor.Command{Stage: "step_script", Script: "echo first-line\n", Output: &out}); err != nil {
			b.Fatal(err)
		}
		first += out.at.Sub(start)
	}
	b.ReportMetric(float64(first.Nanoseconds())/float64(b.N), "first-line-ns/op")
}

// BenchmarkJob is a whole job of one stage with the helper already on
// the host: create-to-first-line-ns is from Create to the script's first
// output line (connect, authenticate, probe and directories, session),
// ns/op until Cleanup returned.
func BenchmarkJob(b *testing.B) {
	needSSHD(b)
	p := newProvider(b, testOptions(b.TempDir()))
	ctx := context.Background()
	warm, err := p.Create(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := warm.Prepare(ctx, opts(0)); err != nil { // uploads the helper
		b.Fatal(err)
	}
	warm.Cleanup(ctx)
	var first time.Duration
	b.ResetTimer()
	for b.Loop() {
		var out firstByte
		start := time.Now()
		e, err := p.Create(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.Prepare(ctx, opts(0)); err != nil {
			b.Fatal(err)
		}
		if err := e.Run(ctx, executor.Command{Stage: "step_script", Script: "echo first-line\n", Output: &out}); err != nil {
			b.Fatal(err)
		}
		first += out.at.Sub(start)
		if err := e.Cleanup(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(first.Nanoseconds())/float64(b.N), "create-to-first-line-ns/op")
}
