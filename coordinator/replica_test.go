package coordinator

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store/postgres"
	"github.com/berthci/berth/internal/fakeclock"
	"github.com/berthci/berth/internal/testenv"
	"github.com/berthci/berth/runnerapi"
)

// newReplicas starts n coordinators sharing one PostgreSQL schema, each
// with its cluster connection, served over real HTTP.
func newReplicas(t *testing.T, n int) []*env {
	t.Helper()
	dsn := testenv.Postgres(t)
	const admin = "replica-admin-token"
	clock := fakeclock.New(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	var envs []*env
	for i := range n {
		ctx := context.Background()
		st, err := postgres.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		cl, err := cluster.OpenPostgres(ctx, dsn, nil)
		if err != nil {
			t.Fatal(err)
		}
		arts, err := artifacts.NewDir(filepath.Join(t.TempDir(), fmt.Sprint(i), "artifacts"))
		if err != nil {
			t.Fatal(err)
		}
		srv, err := New(Config{LongPollTimeout: 2 * time.Second, ReapInterval: time.Hour}, Options{Store: st, Artifacts: arts, Clock: clock, Cluster: cl})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.EnsureAdminToken(ctx, admin); err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv.Handler())
		t.Cleanup(func() {
			srv.Close()
			hs.Close()
			cl.Close()
			st.Close()
		})
		envs = append(envs, &env{t: t, srv: srv, st: st, http: hs, clock: clock, admin: admin})
	}
	return envs
}

// eventually retries cond until it holds (events between replicas take
// milliseconds) or fails the test after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReplicaForgetsPausedAndDeletedRunners: a runner paused or deleted
// through one replica gets no job from another, though that replica had
// it cached (the cache would keep it for an hour here).
func TestReplicaForgetsPausedAndDeletedRunners(t *testing.T) {
	old := runners.CacheTTL
	runners.CacheTTL = time.Hour
	t.Cleanup(func() { runners.CacheTTL = old })
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	tok := a.createRunner(restapi.CreateRunnerRequest{})
	a.enqueue(simpleSpec("first"))
	eventually(t, "replica b hands out a job enqueued on a", func() bool {
		r, j := b.request(tok, "s_1", "")
		return r.code == http.StatusCreated && j != nil
	})
	// b now has the runner cached. Pause it through a: b forgets it.
	var list []restapi.RunnerJSON
	a.adminDo("GET", "/api/v4/runners/all", nil).json(t, &list)
	cached := func() bool { return b.srv.runners.Cached(tok) }
	if !cached() {
		t.Fatal("replica b did not cache the runner")
	}
	expectCode(t, "pause", a.adminDo("PUT", fmt.Sprintf("/api/v4/runners/%d", list[0].ID), map[string]any{"paused": true}), http.StatusOK)
	eventually(t, "replica b forgets the paused runner", func() bool { return !cached() })
	second := a.enqueue(simpleSpec("second"))
	eventually(t, "replica b queues the job enqueued on a", func() bool { return b.srv.queue.Has(second) })
	if r, _ := b.request(tok, "s_1", ""); r.code != http.StatusNoContent || !b.srv.queue.Has(second) {
		t.Fatalf("replica b answered the paused runner %d", r.code)
	}
	if r, _ := a.request(tok, "s_2", ""); r.code != http.StatusNoContent {
		t.Fatalf("replica a answered the paused runner %d", r.code)
	}
	expectCode(t, "unpause", a.adminDo("PUT", fmt.Sprintf("/api/v4/runners/%d", list[0].ID), map[string]any{"paused": false}), http.StatusOK)
	eventually(t, "replica b forgets the runner again", func() bool { return !cached() })
	if r, j := b.request(tok, "s_1", ""); r.code != http.StatusCreated || j == nil || j.ID != second {
		t.Fatalf("replica b after unpausing: %d, %+v; want job %d", r.code, j, second)
	}
	expectCode(t, "delete", a.adminDo("DELETE", fmt.Sprintf("/api/v4/runners/%d", list[0].ID), nil), http.StatusNoContent)
	eventually(t, "replica b refuses the deleted runner's token", func() bool {
		r, _ := b.request(tok, "s_1", "")
		return r.code == http.StatusForbidden
	})
}

// TestReplicaCancelReachesTheRunner: a job running through one replica
// and canceled through another: the runner's next update on the first
// learns it is canceling.
func TestReplicaCancelReachesTheRunner(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	tok := a.createRunner(restapi.CreateRunnerRequest{})
	id := a.enqueue(simpleSpec("long"))
	var job *runnerapi.JobResponse
	eventually(t, "replica b hands out the job", func() bool {
		_, job = b.request(tok, "s_1", "")
		return job != nil
	})
	expectCode(t, "ack", b.update(job, runnerapi.UpdateJobRequest{State: "running"}), http.StatusOK)
	expectCode(t, "cancel", a.adminDo("POST", fmt.Sprintf("/api/v4/projects/1/jobs/%d/cancel", id), nil), http.StatusCreated)
	eventually(t, "replica b tells the runner the job is canceling", func() bool {
		r := b.update(job, runnerapi.UpdateJobRequest{State: "running"})
		return r.header.Get("Job-Status") == "canceling"
	})
}

// TestReplicaQueuesARunOfJobs: jobs enqueued on one replica in a burst,
// with nobody waiting, are all queued on the other, each once, however
// its event loop groups them into runs (TestQueuedReadsARun covers the
// read of a run).
func TestReplicaQueuesARunOfJobs(t *testing.T) {
	rs := newReplicas(t, 2)
	a, b := rs[0], rs[1]
	var ids []int64
	for i := range 300 {
		ids = append(ids, a.enqueue(simpleSpec(fmt.Sprint("burst-", i))))
	}
	eventually(t, "replica b queues every job of the burst", func() bool {
		for _, id := range ids {
			if !b.srv.queue.Has(id) {
				return false
			}
		}
		return true
	})
	if n := b.srv.queue.Len(); n != len(ids) {
		t.Errorf("replica b queues %d jobs, want %d", n, len(ids))
	}
}
