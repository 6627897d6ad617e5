package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/postgres"
	"github.com/berthci/berth/coordinator/store/sqlstore"
	"github.com/berthci/berth/internal/testenv"
)

func openTest(t *testing.T) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(t.Context(), testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// holdWriter blocks the batch writer inside a batch until the returned
// release is called, so that calls made meanwhile queue up and then run
// together in the next batch.
func holdWriter(t *testing.T, s *postgres.Store) (release func()) {
	t.Helper()
	started, done := make(chan struct{}), make(chan struct{})
	rel := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.BatchDo(context.Background(), func(sqlstore.Tx) error {
			close(started)
			<-rel
			return nil
		})
	}()
	<-started
	return func() { close(rel); <-done }
}

// call is one store call made while the writer is held.
type call struct {
	name  string
	fn    func(ctx context.Context) error
	check func(err error) bool // whether err is the expected outcome
}

// runBatch makes every call while the writer is held, checks they were
// taken as one batch, and checks their outcomes.
func runBatch(t *testing.T, s *postgres.Store, calls []call) {
	t.Helper()
	release := holdWriter(t, s)
	batchesBefore := postgres.BatcherOf(s).Batches.Load()
	errs := make(map[string]error)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Go(func() {
			err := c.fn(t.Context())
			mu.Lock()
			errs[c.name] = err
			mu.Unlock()
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for postgres.BatcherOf(s).Queued() < len(calls) {
		if time.Now().After(deadline) {
			t.Fatalf("%d ops queued, want %d", postgres.BatcherOf(s).Queued(), len(calls))
		}
		time.Sleep(time.Millisecond)
	}
	release()
	wg.Wait()
	if n := postgres.BatcherOf(s).Batches.Load() - batchesBefore; n != 1 {
		t.Errorf("calls ran in %d batches, want 1 (the test does not test what it says)", n)
	}
	for _, c := range calls {
		if !c.check(errs[c.name]) {
			t.Errorf("%s: unexpected outcome %v", c.name, errs[c.name])
		}
	}
}

func isNil(err error) bool { return err == nil }

func is(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

func isRange(err error) bool {
	var re *store.RangeError
	return errors.As(err, &re)
}

// TestBatchOutcomes runs one batch of writes that succeed, that fail
// without changing anything (the batch goes on), that fail after changing
// rows (their changes must go: the batch is retried op by op) and that
// take several rounds: each caller gets its own outcome and each change is
// applied exactly once.
func TestBatchOutcomes(t *testing.T) {
	s := openTest(t)
	ctx := t.Context()
	queued := &store.Job{Status: store.StatusPending}
	traced := &store.Job{Status: store.StatusPending}
	for _, err := range []error{s.CreateJob(ctx, queued), s.CreateJob(ctx, traced)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AppendTrace(ctx, traced.ID, 0, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	calls := []call{
		{"append at wrong offset", func(ctx context.Context) error {
			_, err := s.AppendTrace(ctx, traced.ID, 99, []byte("x"))
			return err
		}, isRange},
		{"append", func(ctx context.Context) error { // three rounds
			_, err := s.AppendTrace(ctx, traced.ID, 5, []byte(", world"))
			return err
		}, isNil},
		{"op failing after a write", func(ctx context.Context) error {
			return s.BatchDo(ctx, func(tx sqlstore.Tx) error {
				if _, err := tx.Exec("INSERT INTO settings (key, value) VALUES (?, ?)", "partial", "x"); err != nil {
					return err
				}
				return boom
			})
		}, is(boom)},
		{"setting", func(ctx context.Context) error { return s.PutSetting(ctx, "kept", "v") }, isNil},
		{"transition of missing job", func(ctx context.Context) error {
			_, err := s.TransitionJob(ctx, 1<<40, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusRunning})
			return err
		}, is(store.ErrNotFound)},
		{"assign of missing job", func(ctx context.Context) error {
			return s.AssignJob(ctx, store.Assignment{JobID: 1 << 40, RunnerID: 1, ManagerID: 1, At: time.Now()})
		}, is(store.ErrNotFound)},
		{"touch", func(ctx context.Context) error { return s.TouchJob(ctx, queued.ID, time.Unix(100, 0)) }, isNil},
	}
	created := createCalls(s, 5, &calls)
	runBatch(t, s, calls)

	checkCreated(t, s, created, 2)
	if v, err := s.GetSetting(ctx, "kept"); err != nil || v != "v" {
		t.Errorf("setting put in the batch: %q, %v", v, err)
	}
	if _, err := s.GetSetting(ctx, "partial"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("write of the failed op survived: %v", err)
	}
	var trace bytes.Buffer
	if _, err := s.ReadTrace(ctx, traced.ID, 0, &trace); err != nil || trace.String() != "hello, world" {
		t.Errorf("trace after batch: %q, %v", trace.String(), err)
	}
	if j, err := s.GetJob(ctx, queued.ID); err != nil || !j.UpdatedAt.Equal(time.Unix(100, 0)) {
		t.Errorf("touched job: %+v, %v", j, err)
	}
}

// TestBatchAborted has a statement fail in PostgreSQL, which aborts the
// whole transaction, and an op panic, in one batch: the batch is retried
// op by op, so each caller gets its own outcome and every other op
// applies exactly once.
func TestBatchAborted(t *testing.T) {
	s := openTest(t)
	ctx := t.Context()
	taken := &store.Runner{Type: store.InstanceType, TokenDigest: "taken"}
	other := &store.Runner{Type: store.InstanceType, TokenDigest: "other"}
	for _, err := range []error{s.CreateRunner(ctx, taken), s.CreateRunner(ctx, other)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	calls := []call{
		{"rotate to a taken digest", func(ctx context.Context) error { // unique violation
			return s.RotateRunnerToken(ctx, other.ID, "other", "taken", time.Now(), time.Time{})
		}, is(store.ErrExists)},
		{"panic", func(ctx context.Context) error {
			return s.BatchDo(ctx, func(tx sqlstore.Tx) error {
				if _, err := tx.Exec("INSERT INTO settings (key, value) VALUES (?, ?)", "panicked", "x"); err != nil {
					return err
				}
				panic("bug")
			})
		}, is(sqlstore.ErrTxAborted)},
		{"setting", func(ctx context.Context) error { return s.PutSetting(ctx, "kept", "v") }, isNil},
	}
	created := createCalls(s, 5, &calls)
	runBatch(t, s, calls)

	checkCreated(t, s, created, 0)
	if v, err := s.GetSetting(ctx, "kept"); err != nil || v != "v" {
		t.Errorf("setting put in the batch: %q, %v", v, err)
	}
	if _, err := s.GetSetting(ctx, "panicked"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("write of the panicking op survived: %v", err)
	}
	if r, err := s.GetRunner(ctx, other.ID); err != nil || r.TokenDigest != "other" {
		t.Errorf("runner after the failed rotation: %+v, %v", r, err)
	}
	// The writer still works.
	if err := s.PutSetting(ctx, "after", "ok"); err != nil {
		t.Errorf("write after the batch: %v", err)
	}
}

// createCalls adds n calls creating jobs to calls and returns the jobs
// they create.
func createCalls(s *postgres.Store, n int, calls *[]call) []*store.Job {
	jobs := make([]*store.Job, n)
	for i := range jobs {
		jobs[i] = &store.Job{Status: store.StatusPending, Name: fmt.Sprint("batched ", i), Protected: i%2 == 0}
		*calls = append(*calls, call{fmt.Sprintf("create %d", i), func(ctx context.Context) error {
			return s.CreateJob(ctx, jobs[i])
		}, isNil})
	}
	return jobs
}

// checkCreated checks the jobs are stored, once each, beside the others
// that were there before.
func checkCreated(t *testing.T, s *postgres.Store, created []*store.Job, others int) {
	t.Helper()
	for i, j := range created {
		got, err := s.GetJob(t.Context(), j.ID)
		if err != nil || got.Name != j.Name || got.Protected != (i%2 == 0) {
			t.Errorf("job %d created in the batch: %+v, %v", i, got, err)
		}
	}
	jobs, err := s.ListJobs(t.Context(), store.JobFilter{})
	if err != nil || len(jobs) != others+len(created) {
		t.Errorf("%d jobs, %v; want %d (each created once)", len(jobs), err, others+len(created))
	}
}

// TestBatchScansBooleans: a RowChecked write that reads a row back scans
// the schema's INTEGER 0/1 columns into bools, as database/sql does.
func TestBatchScansBooleans(t *testing.T) {
	s := openTest(t)
	ctx := t.Context()
	j := &store.Job{Status: store.StatusPending, Protected: true}
	if err := s.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	got, err := s.TransitionJob(ctx, j.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusRunning})
	if err != nil || !got.Protected || got.Retried {
		t.Fatalf("TransitionJob: %+v, %v; want protected, not retried", got, err)
	}
}
