package storetest

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// BenchParallelism is the b.SetParallelism factor of the parallel
// benchmarks: goroutines per GOMAXPROCS, standing in for the coordinator's
// concurrent HTTP handlers.
const BenchParallelism = 16

// Bench runs the store benchmarks. open must return a fresh, empty store;
// Bench closes it. Each operation is measured serially (one caller: the
// latency of one write) and in parallel (many callers: the throughput an
// implementation reaches, e.g. with group commit). Every benchmark reports
// ops/s; MixedWrites also reports jobs/s, one job being a CreateJob, an
// AssignJob and a TransitionJob.
func Bench(b *testing.B, open func(b *testing.B) store.Store) {
	benches := []struct {
		name string
		fn   func(b *testing.B, s store.Store, parallel bool)
	}{
		{"CreateJob", benchCreateJob},
		{"AssignJob", benchAssignJob},
		{"TransitionJob", benchTransitionJob},
		{"AppendTrace", benchAppendTrace},
		{"RunnerByTokenDigest", benchRunnerByTokenDigest},
		{"GetJob", benchGetJob},
		{"MixedWrites", benchMixedWrites},
	}
	for _, bb := range benches {
		for _, parallel := range []bool{false, true} {
			name := bb.name
			if parallel {
				name += "Parallel"
			}
			if bb.name == "MixedWrites" && !parallel {
				continue
			}
			b.Run(name, func(b *testing.B) {
				s := open(b)
				b.Cleanup(func() {
					if err := s.Close(); err != nil {
						b.Errorf("Close: %v", err)
					}
				})
				b.ReportAllocs()
				bb.fn(b, s, parallel)
				if e := b.Elapsed().Seconds(); e > 0 && bb.name != "MixedWrites" {
					b.ReportMetric(float64(b.N)/e, "ops/s")
				}
			})
		}
	}
}

// loop runs fn(i) for i in [0, b.N), serially or from many goroutines.
func loop(b *testing.B, parallel bool, fn func(i int64)) {
	if !parallel {
		for i := range int64(b.N) {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	b.SetParallelism(BenchParallelism)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			fn(next.Add(1) - 1)
		}
	})
}

// prepareJobs creates n jobs concurrently (setup, not measured).
func prepareJobs(b *testing.B, s store.Store, n int, edit func(j *store.Job)) []int64 {
	b.Helper()
	ids := make([]int64, n)
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 64 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				j := benchJob()
				if edit != nil {
					edit(j)
				}
				if err := s.CreateJob(b.Context(), j); err != nil {
					b.Error(err)
					return
				}
				ids[i] = j.ID
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return ids
}

// benchJob is a job of a realistic size.
func benchJob() *store.Job {
	j := newJob()
	j.Spec = bytes.Repeat([]byte(`{"variables":[{"key":"CI","value":"true"}]}`), 20)
	return j
}

func benchCreateJob(b *testing.B, s store.Store, parallel bool) {
	ctx := b.Context()
	b.ResetTimer()
	loop(b, parallel, func(int64) {
		if err := s.CreateJob(ctx, benchJob()); err != nil {
			b.Error(err)
		}
	})
}

func benchAssignJob(b *testing.B, s store.Store, parallel bool) {
	ctx := b.Context()
	ids := prepareJobs(b, s, b.N, nil)
	prefix := digest(b)
	b.ResetTimer()
	loop(b, parallel, func(i int64) {
		err := s.AssignJob(ctx, store.Assignment{JobID: ids[i], RunnerID: 1, ManagerID: 1 + i%50, TokenDigest: fmt.Sprint(prefix, i), At: at(0)})
		if err != nil {
			b.Error(err)
		}
	})
}

func benchTransitionJob(b *testing.B, s store.Store, parallel bool) {
	ctx := b.Context()
	ids := prepareJobs(b, s, b.N, nil)
	from := []store.Status{store.StatusPending}
	b.ResetTimer()
	loop(b, parallel, func(i int64) {
		_, err := s.TransitionJob(ctx, ids[i], from, store.JobUpdate{Status: store.StatusRunning, StartedAt: at(time.Second), UpdatedAt: at(time.Second)})
		if err != nil {
			b.Error(err)
		}
	})
}

// benchAppendTrace appends 4 KiB chunks, each caller to its own job (a
// trace has one writer).
func benchAppendTrace(b *testing.B, s store.Store, parallel bool) {
	ctx := b.Context()
	const callers = 256
	ids := prepareJobs(b, s, callers, nil)
	var sizes [callers]atomic.Int64
	var locks [callers]sync.Mutex
	chunk := bytes.Repeat([]byte("build output line\n"), 4096/18)
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	loop(b, parallel, func(i int64) {
		k := i % callers
		locks[k].Lock()
		defer locks[k].Unlock()
		n, err := s.AppendTrace(ctx, ids[k], sizes[k].Load(), chunk)
		if err != nil {
			b.Error(err)
			return
		}
		sizes[k].Store(n)
	})
}

func benchRunnerByTokenDigest(b *testing.B, s store.Store, parallel bool) {
	ctx := b.Context()
	const runners = 1000
	digests := make([]string, runners)
	for i := range digests {
		r := newRunner(b)
		digests[i] = r.TokenDigest
		if err := s.CreateRunner(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	loop(b, parallel, func(i int64) {
		if _, err := s.RunnerByTokenDigest(ctx, digests[i%runners]); err != nil {
			b.Error(err)
		}
	})
}

func benchGetJob(b *testing.B, s store.Store, parallel bool) {
	ctx := b.Context()
	const jobs = 1000
	ids := prepareJobs(b, s, jobs, nil)
	b.ResetTimer()
	loop(b, parallel, func(i int64) {
		if _, err := s.GetJob(ctx, ids[i%jobs]); err != nil {
			b.Error(err)
		}
	})
}

// benchMixedWrites is the dispatch path from many goroutines: enqueue,
// hand out, ack. One iteration is one job (three writes); it reports
// jobs/s and writes/s.
func benchMixedWrites(b *testing.B, s store.Store, _ bool) {
	ctx := b.Context()
	prefix := digest(b)
	from := []store.Status{store.StatusPending}
	var next atomic.Int64
	b.SetParallelism(BenchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1)
			j := benchJob()
			if err := s.CreateJob(ctx, j); err != nil {
				b.Error(err)
				return
			}
			err := s.AssignJob(ctx, store.Assignment{JobID: j.ID, RunnerID: 1, ManagerID: 1 + i%50, TokenDigest: fmt.Sprint(prefix, i), At: at(0)})
			if err != nil {
				b.Error(err)
				return
			}
			_, err = s.TransitionJob(ctx, j.ID, from, store.JobUpdate{Status: store.StatusRunning, StartedAt: at(time.Second), UpdatedAt: at(time.Second)})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	if e := b.Elapsed().Seconds(); e > 0 {
		b.ReportMetric(float64(b.N)/e, "jobs/s")
		b.ReportMetric(3*float64(b.N)/e, "writes/s")
	}
}
