package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/postgres"
	"github.com/berthci/berth/coordinator/store/sqlstore"
	"github.com/berthci/berth/coordinator/store/storetest"
	"github.com/berthci/berth/internal/testenv"
)

func openTemp(t testing.TB) *postgres.Store {
	t.Helper()
	return openAt(t, testenv.Postgres(t))
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return openTemp(t) })
}

func TestMigrationsReopenAndRace(t *testing.T) {
	dsn := testenv.Postgres(t)
	// Replicas starting together: one migrates, the others wait for it and
	// find nothing to do.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			s, err := postgres.Open(t.Context(), dsn)
			if err == nil {
				err = s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Open %d: %v", i, err)
		}
	}
	s := openAt(t, dsn)
	defer s.Close()
	ms, err := sqlstore.Migrations(sqlstore.PostgreSQL)
	if err != nil {
		t.Fatal(err)
	}
	var n, latest int64
	if err := s.DB().QueryRowContext(t.Context(), "SELECT COUNT(*), MAX(version) FROM schema_migrations").Scan(&n, &latest); err != nil {
		t.Fatal(err)
	}
	if n != int64(len(ms)) || latest != ms[len(ms)-1].Version {
		t.Errorf("schema_migrations after five opens: %d rows, latest %d; want %d rows, version %d", n, latest, len(ms), ms[len(ms)-1].Version)
	}
}

func TestMigrationsTooNew(t *testing.T) {
	dsn := testenv.Postgres(t)
	s := openAt(t, dsn)
	if _, err := s.DB().ExecContext(t.Context(), "INSERT INTO schema_migrations (version, applied_at) VALUES (9999, 0)"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := postgres.Open(t.Context(), dsn)
	if err == nil {
		s2.Close()
		t.Fatal("Open of a database with an unknown newer schema version succeeded")
	}
	if !errors.Is(err, postgres.ErrSchemaTooNew) {
		t.Errorf("Open: %v, want ErrSchemaTooNew", err)
	}
}

// TestOpenErrorsHidePassword: a bad connection string or an unreachable
// server is reported without the password.
func TestOpenErrorsHidePassword(t *testing.T) {
	for _, dsn := range []string{
		"postgres://berth:s3cr3t-pw@127.0.0.1:1/berth?connect_timeout=2",
		"postgres://berth:s3cr3t-pw@127.0.0.1:notaport/berth",
		"host=127.0.0.1 port=1 user=berth password=s3cr3t-pw connect_timeout=2",
	} {
		_, err := postgres.Open(t.Context(), dsn)
		if err == nil {
			t.Fatalf("Open(%q) succeeded", dsn)
		}
		if strings.Contains(err.Error(), "s3cr3t-pw") {
			t.Errorf("Open error shows the password: %v", err)
		}
	}
}

// TestTriggerSignsWithReplica: the jobs trigger signs its queue events
// with the replica the writing store names (so that replica can skip its
// own), and with "db" for a store that names none.
func TestTriggerSignsWithReplica(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := t.Context()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	listener, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(context.Background())
	named, err := postgres.Open(ctx, dsn, postgres.WithReplica("a1b2-c3_d4"))
	if err != nil {
		t.Fatal(err)
	}
	defer named.Close()
	anonymous := openAt(t, dsn)
	defer anonymous.Close()
	var schema string
	if err := listener.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{"berth_events_" + schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			t.Fatal(err)
		}
		return n.Payload
	}
	for _, c := range []struct {
		s    *postgres.Store
		sign string
	}{{named, "a1b2-c3_d4"}, {anonymous, "db"}} {
		j := &store.Job{Name: "x", CreatedAt: time.Now()}
		if err := c.s.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
		if got, want := next(), fmt.Sprintf("%s q%d", c.sign, j.ID); got != want {
			t.Errorf("after CreateJob: %q, want %q", got, want)
		}
		if err := c.s.AssignJob(ctx, store.Assignment{JobID: j.ID, RunnerID: 1, ManagerID: 1, TokenDigest: "d" + c.sign, At: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if got, want := next(), fmt.Sprintf("%s t%d", c.sign, j.ID); got != want {
			t.Errorf("after AssignJob: %q, want %q", got, want)
		}
	}
	// A job stored already handed out (placed at creation) was never
	// queued: nothing is announced; the next event is the next job's.
	placed := &store.Job{Name: "placed", RunnerID: 1, RunnerManagerID: 1, TokenDigest: "placed", CreatedAt: time.Now()}
	if err := named.CreateJob(ctx, placed); err != nil {
		t.Fatal(err)
	}
	queued := &store.Job{Name: "queued", CreatedAt: time.Now()}
	if err := named.CreateJob(ctx, queued); err != nil {
		t.Fatal(err)
	}
	if got, want := next(), fmt.Sprintf("a1b2-c3_d4 q%d", queued.ID); got != want {
		t.Errorf("after a placed and a queued job: %q, want %q (nothing for the placed one)", got, want)
	}
	// A name that would break the payload's fields is refused.
	if s, err := postgres.Open(ctx, dsn, postgres.WithReplica("a b")); err == nil {
		s.Close()
		t.Error("Open with the replica name \"a b\" succeeded")
	}
}

// TestAssignJobBusy: a job another transaction holds is neither handed
// out nor reported taken: AssignJob says ErrBusy (whoever holds it may
// roll back, or die), and once the holder rolls back the job is assigned.
// A job the holder did take is ErrConflict after its commit.
func TestAssignJobBusy(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := t.Context()
	s := openAt(t, dsn)
	defer s.Close()
	holder, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	assign := func(id, manager int64) error {
		return s.AssignJob(ctx, store.Assignment{JobID: id, RunnerID: 1, ManagerID: manager,
			TokenDigest: fmt.Sprintf("d%d-%d", id, manager), At: time.Now()})
	}
	for _, commit := range []bool{false, true} {
		j := &store.Job{Name: "held", CreatedAt: time.Now()}
		if err := s.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
		tx, err := holder.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "UPDATE jobs SET runner_manager_id = 99, runner_id = 1 WHERE id = $1", j.ID); err != nil {
			t.Fatal(err)
		}
		if err := assign(j.ID, 1); !errors.Is(err, store.ErrBusy) {
			t.Fatalf("AssignJob of a job another transaction holds: %v, want ErrBusy", err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := assign(j.ID, 1); !errors.Is(err, store.ErrConflict) {
				t.Errorf("AssignJob of a job another transaction took: %v, want ErrConflict", err)
			}
			continue
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := assign(j.ID, 1); err != nil {
			t.Errorf("AssignJob once the holder rolled back: %v", err)
		}
	}
	if err := assign(1<<40, 1); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("AssignJob of a missing job: %v, want ErrNotFound", err)
	}
}

func openAt(t testing.TB, dsn string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, func(b *testing.B) store.Store { return openTemp(b) })
}

// Statements that find one job by id use its primary key only, even
// planned generically on a new table without statistics, where a status
// index ties with it (a plan a prepared statement then keeps, reading
// every pending job's index entry per assignment).
func TestByIDStatementsUseThePrimaryKey(t *testing.T) {
	dsn := testenv.Postgres(t)
	st := openAt(t, dsn) // the schema, fresh
	defer st.Close()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	for i, q := range sqlstore.ByIDStatements() {
		plan := genericPlan(t, conn, fmt.Sprintf("byid%d", i), q)
		if !strings.Contains(plan, "jobs_pkey") || strings.Contains(plan, "jobs_status") {
			t.Errorf("%s\nplanned as:\n%s", q, plan)
		}
	}
	// And those finding a row by a token's digest use its index (not the
	// primary key backwards, for ORDER BY id DESC LIMIT 1).
	i := 0
	for q, index := range sqlstore.ByDigestStatements() {
		i++
		if plan := genericPlan(t, conn, fmt.Sprintf("bydigest%d", i), q); !strings.Contains(plan, "Index Cond") || !strings.Contains(plan, index) {
			t.Errorf("%s\nplanned as:\n%s\nwant an index condition on %s", q, plan, index)
		}
	}
}

// genericPlan prepares q as name on conn (whose plan_cache_mode forces
// generic plans) and returns its EXPLAIN, every parameter NULL.
func genericPlan(t *testing.T, conn *pgx.Conn, name, q string) string {
	t.Helper()
	ctx := t.Context()
	q = postgres.Rebind(q)
	if _, err := conn.Exec(ctx, "PREPARE "+name+" AS "+q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	var params []string
	for range strings.Count(q, "$") {
		params = append(params, "NULL")
	}
	rows, err := conn.Query(ctx, "EXPLAIN EXECUTE "+name+"("+strings.Join(params, ", ")+")")
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	return plan.String()
}
