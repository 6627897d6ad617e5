package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sqlstore"
)

// holdWriter blocks the writer inside a transaction until the returned
// release is called, so that calls made meanwhile queue up and then run
// together in the next batch.
func holdWriter(t *testing.T, s *Store) (release func()) {
	t.Helper()
	started, done := make(chan struct{}), make(chan struct{})
	rel := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.w.do(context.Background(), func(*wtx) error {
			close(started)
			<-rel
			return nil
		})
	}()
	<-started
	return func() { close(rel); <-done }
}

// waitQueued waits until n ops are queued behind a held writer.
func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.w.b.Queued() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d ops queued, want %d", s.w.b.Queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// call is one store call made while the writer is held.
type call struct {
	name  string
	fn    func(ctx context.Context) error
	check func(err error) bool // whether err is the expected outcome
}

// runBatch makes every call while the writer is held, checks they all ran
// in one transaction, and returns their errors by name.
func runBatch(t *testing.T, s *Store, calls []call) map[string]error {
	t.Helper()
	release := holdWriter(t, s)
	batchesBefore := s.w.b.Batches.Load()
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
	waitQueued(t, s, len(calls))
	release()
	wg.Wait()
	if n := s.w.b.Batches.Load() - batchesBefore; n != 1 {
		t.Errorf("calls ran in %d batches, want 1 (the test does not test what it says)", n)
	}
	for _, c := range calls {
		if !c.check(errs[c.name]) {
			t.Errorf("%s: unexpected outcome %v", c.name, errs[c.name])
		}
	}
	return errs
}

func isNil(err error) bool { return err == nil }

func is(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

func isRange(err error) bool {
	var re *store.RangeError
	return errors.As(err, &re)
}

// TestGroupCommitIsolation runs failing and succeeding calls in one
// transaction: each failure is its caller's alone, a failed multi-statement
// op leaves nothing behind, and what succeeded survives a reopen.
func TestGroupCommitIsolation(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "berth.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()

	taken := &store.Runner{Type: store.InstanceType, TokenDigest: "taken"}
	queued := &store.Job{Status: store.StatusPending}
	traced := &store.Job{Status: store.StatusPending}
	for _, err := range []error{s.CreateRunner(ctx, taken), s.CreateJob(ctx, queued), s.CreateJob(ctx, traced)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	newJob := &store.Job{Status: store.StatusPending, Name: "new"}
	boom := errors.New("boom")

	calls := []call{
		{"create job", func(ctx context.Context) error { return s.CreateJob(ctx, newJob) }, isNil},
		{"duplicate runner", func(ctx context.Context) error {
			return s.CreateRunner(ctx, &store.Runner{Type: store.InstanceType, TokenDigest: "taken"})
		}, is(store.ErrExists)},
		{"append at wrong offset", func(ctx context.Context) error {
			_, err := s.AppendTrace(ctx, traced.ID, 99, []byte("x")) // wrong before and after "append"
			return err
		}, isRange},
		{"append", func(ctx context.Context) error {
			_, err := s.AppendTrace(ctx, traced.ID, 0, []byte("hello"))
			return err
		}, isNil},
		{"artifact of missing job", func(ctx context.Context) error {
			_, err := s.PutArtifact(ctx, &store.Artifact{JobID: 1 << 40, Type: "archive"})
			return err
		}, is(store.ErrNotFound)},
		{"multi op failing after a write", func(ctx context.Context) error {
			return s.w.do(ctx, func(tx *wtx) error {
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
		{"touch", func(ctx context.Context) error { return s.TouchJob(ctx, queued.ID, time.Unix(100, 0)) }, isNil},
	}
	runBatch(t, s, calls)

	// Reopen: what the batch committed is on disk, the rest is not.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(ctx, path); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetJob(ctx, newJob.ID); err != nil || newJob.ID == 0 {
		t.Errorf("job created in the batch: id %d, %v", newJob.ID, err)
	}
	if v, err := s.GetSetting(ctx, "kept"); err != nil || v != "v" {
		t.Errorf("setting put in the batch: %q, %v", v, err)
	}
	if _, err := s.GetSetting(ctx, "partial"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("write of the failed multi op survived: %v", err)
	}
	if ti, err := s.TraceInfo(ctx, traced.ID); err != nil || ti.Size != 5 {
		t.Errorf("trace after batch: %+v, %v; want size 5", ti, err)
	}
	if j, err := s.GetJob(ctx, queued.ID); err != nil || !j.UpdatedAt.Equal(time.Unix(100, 0)) {
		t.Errorf("touched job: %+v, %v", j, err)
	}
	if rs, err := s.ListRunners(ctx); err != nil || len(rs) != 1 {
		t.Errorf("runners: %d, %v; want 1", len(rs), err)
	}
}

// TestGroupCommitAbortedTransaction has an op end the whole transaction
// mid-batch, as SQLite does on some I/O errors, and panic in another: the
// batch is retried op by op, so every other op applies exactly once.
func TestGroupCommitAbortedTransaction(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	var calls []call
	for i := range 10 {
		calls = append(calls, call{fmt.Sprintf("create %d", i), func(ctx context.Context) error {
			return s.CreateJob(ctx, &store.Job{Status: store.StatusPending, Name: fmt.Sprint(i)})
		}, isNil})
		switch i {
		case 3:
			calls = append(calls, call{"rollback", func(ctx context.Context) error {
				return s.w.do(ctx, func(tx *wtx) error {
					if err := tx.control("ROLLBACK"); err != nil {
						return err
					}
					return fmt.Errorf("disk on fire: %w", sqlstore.ErrTxAborted)
				})
			}, is(sqlstore.ErrTxAborted)})
		case 6:
			calls = append(calls, call{"panic", func(ctx context.Context) error {
				return s.w.do(ctx, func(tx *wtx) error {
					if _, err := tx.Exec("INSERT INTO settings (key, value) VALUES (?, ?)", "panicked", "x"); err != nil {
						return err
					}
					panic("bug")
				})
			}, func(err error) bool { return err != nil }})
		}
	}
	runBatch(t, s, calls)

	jobs, err := s.ListJobs(ctx, store.JobFilter{})
	if err != nil {
		t.Fatal(err)
	}
	names := make(map[string]int)
	for _, j := range jobs {
		names[j.Name]++
	}
	for i := range 10 {
		if n := names[fmt.Sprint(i)]; n != 1 {
			t.Errorf("job %d stored %d times, want once", i, n)
		}
	}
	if len(jobs) != 10 {
		t.Errorf("%d jobs, want 10", len(jobs))
	}
	if _, err := s.GetSetting(ctx, "panicked"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("write of the panicking op survived: %v", err)
	}
	// The writer still works.
	if err := s.PutSetting(ctx, "after", "ok"); err != nil {
		t.Errorf("write after aborted batch: %v", err)
	}
}

// TestQueryPlans checks that the hot lookups use their indexes.
func TestQueryPlans(t *testing.T) {
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tests := []struct {
		query string
		args  []any
		index string
	}{
		// The store's hot lookups, as package sqlstore writes them.
		{"SELECT id FROM runners WHERE token_digest = ?", []any{"d"}, "runners_token_digest"},
		{"SELECT id FROM jobs WHERE token_digest = ? ORDER BY id DESC LIMIT 1", []any{"d"}, "jobs_token_digest"},
		{"SELECT id FROM jobs WHERE status IN (?) ORDER BY id", []any{"pending"}, "jobs_status"},
		{"SELECT id FROM jobs WHERE project_id = ? ORDER BY id", []any{1}, "jobs_project_id"},
		{"SELECT id FROM jobs WHERE pipeline_id = ? ORDER BY id", []any{1}, "jobs_pipeline_id"},
		{"SELECT id FROM artifacts WHERE job_id = ? ORDER BY id", []any{1}, "artifacts_job_id_type"},
		{"SELECT id FROM artifacts WHERE expire_at IS NOT NULL AND expire_at < ? ORDER BY expire_at, id LIMIT ?", []any{1, 10}, "artifacts_expire_at"},
		{"SELECT pos, data FROM trace_chunks WHERE job_id = ? AND pos + length(data) > ? ORDER BY pos", []any{1, 0}, "sqlite_autoindex_trace_chunks_1"},
	}
	for _, tt := range tests {
		rows, err := s.rdb.QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+tt.query, tt.args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan += detail + "; "
		}
		rows.Close()
		if !strings.Contains(plan, tt.index) {
			t.Errorf("plan of %q: %s; want index %s", tt.query, plan, tt.index)
		}
	}
}

// TestPragmas checks the settings each connection opens with.
func TestPragmas(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "berth.db"), WithBusyTimeout(1234*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tests := []struct {
		name  string
		query func(q string) *sql.Row
		want  map[string]int64
	}{
		{"writer", func(q string) *sql.Row { return s.w.conn.QueryRowContext(ctx, q) }, map[string]int64{
			"synchronous": 1, "foreign_keys": 1, "busy_timeout": 1234, "wal_autocheckpoint": 0,
		}},
		{"reader", func(q string) *sql.Row { return s.rdb.QueryRowContext(ctx, q) }, map[string]int64{
			"query_only": 1, "busy_timeout": 1234,
		}},
	}
	for _, tt := range tests {
		for pragma, want := range tt.want {
			var got int64
			if err := tt.query("PRAGMA " + pragma).Scan(&got); err != nil {
				t.Fatalf("%s: PRAGMA %s: %v", tt.name, pragma, err)
			}
			if got != want {
				t.Errorf("%s: PRAGMA %s = %d, want %d", tt.name, pragma, got, want)
			}
		}
	}
}

func TestSynchronousOff(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "berth.db"), WithSynchronous("off"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got int64
	if err := s.w.conn.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&got); err != nil || got != 0 {
		t.Fatalf("PRAGMA synchronous = %d (%v), want 0 (OFF)", got, err)
	}
}
