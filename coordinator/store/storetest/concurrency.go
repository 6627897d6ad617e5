package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// testConcurrentAssign races many managers for the same jobs, the way
// concurrent jobs/request calls do: every job must be handed out exactly
// once, and the stored assignment must be the winner's.
func testConcurrentAssign(t *testing.T, s store.Store) {
	ctx := t.Context()
	const workers, jobs = 16, 60
	r := createRunner(t, s)
	managers := make([]*store.RunnerManager, workers)
	tokens := make([]string, workers)
	for w := range managers {
		managers[w] = &store.RunnerManager{RunnerID: r.ID, SystemID: fmt.Sprintf("s_%d", w), ContactedAt: at(0)}
		must(t, s.UpsertRunnerManager(ctx, managers[w]))
		tokens[w] = digest(t)
	}
	ids := make([]int64, jobs)
	for i := range ids {
		ids[i] = createJob(t, s).ID
	}

	winner := make([]atomic.Int64, jobs) // worker+1 that won each job
	var wins atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range workers {
		wg.Go(func() {
			<-start
			for k := range jobs {
				i := (k + w*7) % jobs // different orders, much overlap
				a := store.Assignment{
					JobID:     ids[i],
					RunnerID:  r.ID,
					ManagerID: managers[w].ID,
					// A token per (worker, job): reusing one across jobs
					// would make JobByTokenDigest ambiguous.
					TokenDigest: fmt.Sprintf("%s-%d", tokens[w], i),
					At:          at(0),
				}
				err := s.AssignJob(ctx, a)
				for errors.Is(err, store.ErrBusy) {
					// Another worker's transaction holds it: its
					// outcome decides (a store that skips locked rows).
					time.Sleep(time.Millisecond)
					err = s.AssignJob(ctx, a)
				}
				switch {
				case err == nil:
					wins.Add(1)
					if !winner[i].CompareAndSwap(0, int64(w+1)) {
						t.Errorf("job %d assigned twice (workers %d and %d)", ids[i], winner[i].Load()-1, w)
					}
				case errors.Is(err, store.ErrConflict):
				default:
					t.Errorf("AssignJob(job %d, worker %d): %v", ids[i], w, err)
				}
			}
		})
	}
	close(start)
	wg.Wait()

	if wins.Load() != jobs {
		t.Errorf("%d successful assignments for %d jobs, want exactly one each", wins.Load(), jobs)
	}
	for i, id := range ids {
		w := int(winner[i].Load()) - 1
		if w < 0 {
			t.Errorf("job %d never assigned", id)
			continue
		}
		j := getJob(t, s, id)
		if j.RunnerManagerID != managers[w].ID || j.TokenDigest != fmt.Sprintf("%s-%d", tokens[w], i) {
			t.Errorf("job %d: stored manager %d token %q, winner was manager %d", id, j.RunnerManagerID, j.TokenDigest, managers[w].ID)
		}
		if j.Status != store.StatusPending {
			t.Errorf("job %d: status %s after assign, want pending", id, j.Status)
		}
	}
}

// testConcurrentAppendTrace has several writers append to one trace, each
// retrying at the size a RangeError reports; nothing may be lost or
// doubled and the CRC must match the bytes.
func testConcurrentAppendTrace(t *testing.T, s store.Store) {
	ctx := t.Context()
	const writers, lines = 6, 25
	j := createJob(t, s)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			var off int64
			for n := range lines {
				line := fmt.Appendf(nil, "writer %d line %d\n", w, n)
				for tries := 0; ; tries++ {
					size, err := s.AppendTrace(ctx, j.ID, off, line)
					var re *store.RangeError
					if errors.As(err, &re) && tries < 10000 {
						off = re.Size
						continue
					}
					if err != nil {
						t.Errorf("AppendTrace: %v", err)
						return
					}
					off = size
					break
				}
			}
		})
	}
	wg.Wait()

	all := readTrace(t, s, j.ID, 0)
	for w := range writers {
		for n := range lines {
			line := fmt.Appendf(nil, "writer %d line %d\n", w, n)
			if c := bytes.Count(all, line); c != 1 {
				t.Errorf("line %q appears %d times, want once", line, c)
			}
		}
	}
	want := store.TraceInfo{Size: int64(len(all)), CRC32: crc32.ChecksumIEEE(all)}
	if ti := traceInfo(t, s, j.ID); ti != want {
		t.Errorf("TraceInfo = %+v, want %+v (of the bytes read back)", ti, want)
	}
}

// testConcurrentTransition races an ack (pending → running) against a
// cancel (pending → canceled) on many jobs: exactly one wins each.
func testConcurrentTransition(t *testing.T, s store.Store) {
	ctx := t.Context()
	const jobs = 40
	ids := make([]int64, jobs)
	for i := range ids {
		ids[i] = createJob(t, s).ID
	}
	targets := []store.Status{store.StatusRunning, store.StatusCanceled, store.StatusRunning, store.StatusCanceled}
	won := make([][]atomic.Bool, len(targets))
	for i := range won {
		won[i] = make([]atomic.Bool, jobs)
	}
	var wg sync.WaitGroup
	for g, to := range targets {
		wg.Go(func() {
			for i, id := range ids {
				j, err := s.TransitionJob(ctx, id, []store.Status{store.StatusPending}, store.JobUpdate{Status: to})
				switch {
				case err == nil:
					won[g][i].Store(true)
					if j.Status != to {
						t.Errorf("job %d: TransitionJob returned status %s, want %s", id, j.Status, to)
					}
				case errors.Is(err, store.ErrConflict):
				default:
					t.Errorf("TransitionJob(job %d): %v", id, err)
				}
			}
		})
	}
	wg.Wait()
	for i, id := range ids {
		var winners []store.Status
		for g := range targets {
			if won[g][i].Load() {
				winners = append(winners, targets[g])
			}
		}
		if len(winners) != 1 {
			t.Errorf("job %d: %d transitions from pending applied, want 1", id, len(winners))
			continue
		}
		if st := getJob(t, s, id).Status; st != winners[0] {
			t.Errorf("job %d: status %s, want the winner's %s", id, st, winners[0])
		}
	}
}

// testConcurrentCreate creates records numbered per project, and records
// that must exist once, from many goroutines at once: on a store with
// concurrent writers (PostgreSQL, several replicas) the numbering and the
// uniqueness must hold as they do on one writer.
func testConcurrentCreate(t *testing.T, s store.Store) {
	ctx := t.Context()
	p := createProject(t, s, "busy")
	const n = 24
	var (
		wg       sync.WaitGroup
		iids     = make([]int64, n)
		envs     = make([]int64, n)
		created  atomic.Int32
		runnerOK atomic.Int32
	)
	shared := digest(t)
	for i := range n {
		wg.Go(func() {
			pl := &store.Pipeline{ProjectID: p.ID, Ref: "main", Sha: fmt.Sprint(i), Source: "push", CreatedAt: at(0)}
			if err := s.CreatePipeline(ctx, pl); err != nil {
				t.Errorf("CreatePipeline %d: %v", i, err)
				return
			}
			iids[i] = pl.IID
			e := &store.Environment{ProjectID: p.ID, Name: "production", CreatedAt: at(0), UpdatedAt: at(0)}
			c, err := s.EnsureEnvironment(ctx, e)
			if err != nil {
				t.Errorf("EnsureEnvironment %d: %v", i, err)
				return
			}
			if c {
				created.Add(1)
			}
			envs[i] = e.ID
			r := newRunner(t)
			r.TokenDigest = shared
			switch err := s.CreateRunner(ctx, r); {
			case err == nil:
				runnerOK.Add(1)
			case errors.Is(err, store.ErrExists):
			default:
				t.Errorf("CreateRunner %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	seen := make(map[int64]bool)
	for _, iid := range iids {
		if iid < 1 || iid > n || seen[iid] {
			t.Errorf("pipeline IIDs %v: want each of 1..%d once", iids, n)
			break
		}
		seen[iid] = true
	}
	if created.Load() != 1 {
		t.Errorf("EnsureEnvironment of one name from %d goroutines created %d, want 1", n, created.Load())
	}
	for _, id := range envs {
		if id != envs[0] {
			t.Errorf("EnsureEnvironment returned ids %v, want one id", envs)
			break
		}
	}
	if runnerOK.Load() != 1 {
		t.Errorf("CreateRunner with one token digest from %d goroutines succeeded %d times, want 1", n, runnerOK.Load())
	}
}
