package sqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"hash/crc32"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sqlite"
	"github.com/berthci/berth/coordinator/store/sqlstore"
	"github.com/berthci/berth/coordinator/store/storetest"
)

func openTemp(t testing.TB) *sqlite.Store {
	t.Helper()
	return openAt(t, filepath.Join(t.TempDir(), "berth.db"))
}

func openAt(t testing.TB, path string, opts ...sqlite.Option) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return openTemp(t) })
}

// rawDB opens the file with the plain driver, to look behind the store.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestMigrationsReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	for range 3 {
		s := openAt(t, path)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	db := rawDB(t, path)
	var n, latest int
	if err := db.QueryRow("SELECT COUNT(*), MAX(version) FROM schema_migrations").Scan(&n, &latest); err != nil {
		t.Fatal(err)
	}
	// Every migration is applied once.
	ms, err := sqlstore.Migrations(sqlstore.SQLite)
	if err != nil || len(ms) == 0 {
		t.Fatalf("listing migrations: %v (%d)", err, len(ms))
	}
	want := int(ms[len(ms)-1].Version)
	if n != len(ms) || latest != want {
		t.Errorf("schema_migrations after three opens: %d rows, latest %d; want %d rows, version %d", n, latest, len(ms), want)
	}
	var journal string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&journal); err != nil {
		t.Fatal(err)
	}
	if journal != "wal" {
		t.Errorf("journal_mode = %q, want wal", journal)
	}
}

func TestMigrationsTooNew(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	if err := openAt(t, path).Close(); err != nil {
		t.Fatal(err)
	}
	db := rawDB(t, path)
	if _, err := db.Exec("INSERT INTO schema_migrations (version, applied_at) VALUES (9999, 0)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := sqlite.Open(t.Context(), path)
	if err == nil {
		s.Close()
		t.Fatal("Open of a database with an unknown newer schema version succeeded")
	}
	if !errors.Is(err, sqlite.ErrSchemaTooNew) {
		t.Errorf("Open: %v, want ErrSchemaTooNew", err)
	}
}

func TestOpenBadArguments(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		path string
		opts []sqlite.Option
	}{
		{"empty path", "", nil},
		{"memory", ":memory:", nil},
		{"uri", "file:x.db", nil},
		{"query in path", filepath.Join(dir, "x.db?mode=ro"), nil},
		{"bad synchronous", filepath.Join(dir, "a.db"), []sqlite.Option{sqlite.WithSynchronous("SOMETIMES")}},
		{"no readers", filepath.Join(dir, "b.db"), []sqlite.Option{sqlite.WithReaders(0)}},
		{"no batch", filepath.Join(dir, "c.db"), []sqlite.Option{sqlite.WithMaxBatch(0)}},
		{"missing directory", filepath.Join(dir, "no", "such", "dir.db"), nil},
	}
	for _, tt := range tests {
		s, err := sqlite.Open(t.Context(), tt.path, tt.opts...)
		if err == nil {
			s.Close()
			t.Errorf("%s: Open succeeded", tt.name)
		}
	}
}

// TestDurability closes and reopens the file: everything a call reported
// as done is there, and ids keep increasing.
func TestDurability(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "berth.db")
	at := time.Date(2025, 6, 1, 12, 0, 0, 123456000, time.UTC)

	s := openAt(t, path, sqlite.WithSynchronous("FULL"))
	if err := s.PutSetting(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	r := &store.Runner{Type: store.InstanceType, TokenDigest: "d1", Tags: []string{"a"}, CreatedAt: at}
	if err := s.CreateRunner(ctx, r); err != nil {
		t.Fatal(err)
	}
	j := &store.Job{Status: store.StatusPending, Name: "build", CreatedAt: at, UpdatedAt: at}
	if err := s.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	if err := s.AssignJob(ctx, store.Assignment{JobID: j.ID, RunnerID: r.ID, ManagerID: 1, TokenDigest: "jt", At: at}); err != nil {
		t.Fatal(err)
	}
	trace := []byte("line 1\nline 2\n")
	if _, err := s.AppendTrace(ctx, j.ID, 0, trace[:7]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendTrace(ctx, j.ID, 7, trace[7:]); err != nil {
		t.Fatal(err)
	}
	a := &store.Artifact{JobID: j.ID, Type: "archive", StorageKey: "k", ExpireAt: at}
	if _, err := s.PutArtifact(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openAt(t, path)
	defer s.Close()
	if v, err := s.GetSetting(ctx, "k"); err != nil || v != "v" {
		t.Errorf("setting after reopen: %q, %v", v, err)
	}
	if got, err := s.RunnerByTokenDigest(ctx, "d1"); err != nil || got.ID != r.ID || !got.CreatedAt.Equal(at) {
		t.Errorf("runner after reopen: %+v, %v", got, err)
	}
	got, err := s.JobByTokenDigest(ctx, "jt")
	if err != nil || got.ID != j.ID || got.RunnerID != r.ID || !got.AssignedAt.Equal(at) {
		t.Errorf("job after reopen: %+v, %v", got, err)
	}
	ti, err := s.TraceInfo(ctx, j.ID)
	if err != nil || ti != (store.TraceInfo{Size: int64(len(trace)), CRC32: crc32.ChecksumIEEE(trace)}) {
		t.Errorf("trace info after reopen: %+v, %v", ti, err)
	}
	var buf bytes.Buffer
	if _, err := s.ReadTrace(ctx, j.ID, 0, &buf); err != nil || !bytes.Equal(buf.Bytes(), trace) {
		t.Errorf("trace after reopen: %q, %v", buf.Bytes(), err)
	}
	if arts, err := s.ListArtifacts(ctx, j.ID); err != nil || len(arts) != 1 || arts[0].ID != a.ID {
		t.Errorf("artifacts after reopen: %v, %v", arts, err)
	}
	k := &store.Job{Status: store.StatusPending}
	if err := s.CreateJob(ctx, k); err != nil {
		t.Fatal(err)
	}
	if k.ID <= j.ID {
		t.Errorf("job id after reopen %d, want > %d", k.ID, j.ID)
	}
}

func TestClosed(t *testing.T) {
	ctx := t.Context()
	s := openTemp(t)
	j := &store.Job{Status: store.StatusPending}
	if err := s.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.CreateJob(ctx, &store.Job{}); !errors.Is(err, sqlite.ErrClosed) {
		t.Errorf("CreateJob after Close: %v, want ErrClosed", err)
	}
	if _, err := s.GetJob(ctx, j.ID); err == nil {
		t.Error("GetJob after Close succeeded")
	}
}

func TestCanceledContext(t *testing.T) {
	s := openTemp(t)
	defer s.Close()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	j := &store.Job{Status: store.StatusPending}
	if err := s.CreateJob(ctx, j); !errors.Is(err, context.Canceled) {
		t.Errorf("CreateJob with canceled context: %v, want context.Canceled", err)
	}
	if jobs, err := s.ListJobs(t.Context(), store.JobFilter{}); err != nil || len(jobs) != 0 {
		t.Errorf("jobs after canceled create: %d, %v; want none", len(jobs), err)
	}
}

// TestPagesMigrationKeepsDeployments: migration 13 rebuilds
// pages_deployments without its job foreign key; a database made before
// it keeps its deployments, and new ones get ids after theirs.
func TestPagesMigrationKeepsDeployments(t *testing.T) {
	path := filepath.Join(t.TempDir(), "berth.db")
	db := rawDB(t, path)
	ms, err := sqlstore.Migrations(sqlstore.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"PRAGMA journal_mode=WAL", "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range ms {
		if m.Version >= 13 {
			break
		}
		if _, err := db.Exec(m.SQL); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if _, err := db.Exec("INSERT INTO schema_migrations VALUES (?, 0)", m.Version); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{
		"INSERT INTO projects (id, path) VALUES (3, 'p')",
		"INSERT INTO jobs (id, status, project_id) VALUES (4, 'success', 3)",
		"INSERT INTO pages_deployments (id, project_id, job_id, dir, size) VALUES (7, 3, 4, 'site', 99)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()

	s := openAt(t, path)
	list, err := s.ListPagesDeployments(t.Context(), 3)
	if err != nil || len(list) != 1 || list[0].ID != 7 || list[0].JobID != 4 || list[0].Dir != "site" || list[0].Size != 99 {
		t.Fatalf("deployments after the migration: %+v (%v)", list, err)
	}
	d := &store.PagesDeployment{ProjectID: 3, JobID: 4, PathPrefix: "mr-1", Dir: "mr"}
	if _, err := s.PutPagesDeployment(t.Context(), d); err != nil || d.ID <= 7 {
		t.Errorf("a new deployment: id %d (%v), want one after 7", d.ID, err)
	}
}
