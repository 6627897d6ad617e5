package cluster_test

import (
	"database/sql"

	"context"
	_ "github.com/jackc/pgx/v5/stdlib"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/postgres"
	"github.com/berthci/berth/internal/testenv"
)

func open(t *testing.T, dsn string) *cluster.Postgres {
	t.Helper()
	c, err := cluster.OpenPostgres(t.Context(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func next(t *testing.T, c *cluster.Postgres) cluster.Event {
	t.Helper()
	select {
	case e := <-c.Events():
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
		return cluster.Event{}
	}
}

func TestEventsReachTheOthers(t *testing.T) {
	dsn := testenv.Postgres(t)
	a, b, c := open(t, dsn), open(t, dsn), open(t, dsn)
	// Another schema's replicas hear nothing of these.
	other := open(t, testenv.Postgres(t))
	a.Publish(cluster.Event{Kind: cluster.JobChanged, ID: 7})
	a.Publish(cluster.Event{Kind: cluster.PipelineChanged, ID: 7})
	for _, r := range []*cluster.Postgres{b, c} {
		if e := next(t, r); e != (cluster.Event{Kind: cluster.JobChanged, ID: 7}) {
			t.Errorf("first event %v, want j7", e)
		}
		if e := next(t, r); e != (cluster.Event{Kind: cluster.PipelineChanged, ID: 7}) {
			t.Errorf("second event %v, want p7", e)
		}
	}
	b.Publish(cluster.Event{Kind: cluster.RunnerChanged, ID: 3})
	if e := next(t, a); e != (cluster.Event{Kind: cluster.RunnerChanged, ID: 3}) {
		t.Errorf("a got %v, want r3", e)
	}
	next(t, c)
	// Nobody hears its own events, and the other schema heard nothing.
	select {
	case e := <-a.Events():
		t.Errorf("a heard %v (its own?)", e)
	case e := <-other.Events():
		t.Errorf("a replica of another schema heard %v", e)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestOneLeaderAndTakeover(t *testing.T) {
	dsn := testenv.Postgres(t)
	var leading atomic.Int32
	var maxLeading atomic.Int32
	led := make(chan int, 8)
	reps := make([]*cluster.Postgres, 3)
	cancels := make([]context.CancelFunc, 3)
	var wg sync.WaitGroup
	for i := range reps {
		reps[i] = open(t, dsn)
		ctx, cancel := context.WithCancel(t.Context())
		cancels[i] = cancel
		wg.Go(func() {
			reps[i].Lead(ctx, func(ctx context.Context) {
				n := leading.Add(1)
				for {
					m := maxLeading.Load()
					if n <= m || maxLeading.CompareAndSwap(m, n) {
						break
					}
				}
				led <- i
				<-ctx.Done()
				leading.Add(-1)
			})
		})
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
		wg.Wait()
	}()
	first := <-led
	// The leader goes (as a killed process's session ends): another
	// replica leads within a few lease retries.
	start := time.Now()
	cancels[first]()
	select {
	case second := <-led:
		if second == first {
			t.Errorf("replica %d led again after it stopped", first)
		}
		t.Logf("takeover after %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * cluster.LeaseRetry):
		t.Fatal("no replica took over the lead")
	}
	if m := maxLeading.Load(); m != 1 {
		t.Errorf("%d replicas led at once", m)
	}
}

func TestEngineLockExcludes(t *testing.T) {
	dsn := testenv.Postgres(t)
	a, b := open(t, dsn), open(t, dsn)
	var inside, overlap atomic.Int32
	var wg sync.WaitGroup
	for _, c := range []*cluster.Postgres{a, b} {
		wg.Go(func() {
			for range 20 {
				unlock, err := c.EngineLock(t.Context())
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) > 1 {
					overlap.Add(1)
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				unlock()
			}
		})
	}
	wg.Wait()
	if overlap.Load() != 0 {
		t.Errorf("engine lock held by two replicas at once %d times", overlap.Load())
	}
}

// TestResyncAfterLostConnection: when the connection carrying events
// breaks, the listener reconnects and says Resync (what was sent
// meanwhile is lost), and events flow again.
func TestResyncAfterLostConnection(t *testing.T) {
	dsn := testenv.Postgres(t)
	a, b := open(t, dsn), open(t, dsn)
	db := openDB(t, dsn)
	res, err := db.ExecContext(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE query = 'LISTEN "berth_events_' || current_schema() || '"' AND pid <> pg_backend_pid()`)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 2 {
		t.Fatalf("terminated %d listeners, want 2", n)
	}
	if e := next(t, b); e.Kind != cluster.Resync {
		t.Fatalf("after the connection broke: %v, want Resync", e)
	}
	if e := next(t, a); e.Kind != cluster.Resync {
		t.Fatalf("after the connection broke: %v, want Resync", e)
	}
	a.Publish(cluster.Event{Kind: cluster.RunnerChanged, ID: 9})
	if e := next(t, b); e != (cluster.Event{Kind: cluster.RunnerChanged, ID: 9}) {
		t.Errorf("after reconnecting: %v, want r9", e)
	}
}

func openDB(t *testing.T, dsn string) *sql.DB {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestQueueEventsFromTheStore: the PostgreSQL store's trigger tells every
// replica (the writer's too) when a job enters and leaves the queue, when
// the write commits.
func TestQueueEventsFromTheStore(t *testing.T) {
	dsn := testenv.Postgres(t)
	st, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a := open(t, dsn)
	j := &store.Job{Name: "x", CreatedAt: time.Now()}
	if err := st.CreateJob(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	if e := next(t, a); e != (cluster.Event{Kind: cluster.JobQueued, ID: j.ID}) {
		t.Fatalf("after CreateJob: %v, want q%d", e, j.ID)
	}
	if err := st.AssignJob(t.Context(), store.Assignment{JobID: j.ID, RunnerID: 1, ManagerID: 1, TokenDigest: "d", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if e := next(t, a); e != (cluster.Event{Kind: cluster.JobTaken, ID: j.ID}) {
		t.Fatalf("after AssignJob: %v, want t%d", e, j.ID)
	}
	if err := st.UnassignJob(t.Context(), j.ID, 1); err != nil {
		t.Fatal(err)
	}
	if e := next(t, a); e != (cluster.Event{Kind: cluster.JobQueued, ID: j.ID}) {
		t.Fatalf("after UnassignJob: %v, want q%d", e, j.ID)
	}
	// A write that does not apply says nothing.
	if _, err := st.TransitionJob(t.Context(), j.ID, []store.Status{store.StatusRunning}, store.JobUpdate{Status: store.StatusSuccess}); err == nil {
		t.Fatal("transition from the wrong status applied")
	}
	if _, err := st.TransitionJob(t.Context(), j.ID, []store.Status{store.StatusPending}, store.JobUpdate{Status: store.StatusCanceled}); err != nil {
		t.Fatal(err)
	}
	if e := next(t, a); e != (cluster.Event{Kind: cluster.JobTaken, ID: j.ID}) {
		t.Fatalf("after cancel: %v, want t%d", e, j.ID)
	}
}
