package coordinator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/runners"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/executor"
)

// Isolation levels (docs/isolation.md). A job asks for a level (the ci
// keyword isolation:, or the BERTH_ISOLATION variable); its project may set
// a minimum; the job needs the stronger of the two. Runner managers offer
// levels in info.isolation_levels of their requests (none when they name
// none), and the queue hands a job only to a runner whose strongest
// offered level is at least as strong as the one the job needs.
//
// The coordinator remembers what each runner manager offered and when it
// last asked, so that a job nobody can take says why (pending_reason).

// parseIsolation parses a level named through the API; empty means none
// was named and is returned as is.
func parseIsolation(s string) (executor.Isolation, error) {
	if s == "" {
		return "", nil
	}
	return executor.ParseIsolation(s)
}

// isolationBook holds the offers of runner managers and the projects'
// minimum levels. It is safe for concurrent use.
type isolationBook struct {
	mu       sync.Mutex
	minimums map[int64]executor.Isolation // project id → minimum (absent: none)
}

func (b *isolationBook) init() {
	b.minimums = map[int64]executor.Isolation{}
}

func (b *isolationBook) minimum(projectID int64) executor.Isolation {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.minimums[projectID]
}

// setMinimum records a project's minimum and reports whether it changed.
func (b *isolationBook) setMinimum(projectID int64, l executor.Isolation) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l == executor.IsolationNone {
		l = ""
	}
	if b.minimums[projectID] == l {
		return false
	}
	if l == "" {
		delete(b.minimums, projectID)
	} else {
		b.minimums[projectID] = l
	}
	return true
}

// jobIsolation is the level a job needs: the stronger of what it asks for
// and its project's minimum; none when neither names one.
func (s *Server) jobIsolation(j *store.Job) executor.Isolation {
	asked, _ := parseIsolation(j.Isolation) // written by this coordinator, checked then
	l := executor.StrongerIsolation(asked, s.isolation.minimum(j.ProjectID))
	if l == "" {
		return executor.IsolationNone
	}
	return l
}

// queueJob converts a stored job to the queue's matching view, with the
// isolation it needs now.
func (s *Server) queueJob(j *store.Job) *queue.Job {
	return &queue.Job{
		ID:           j.ID,
		ProjectID:    j.ProjectID,
		NamespaceIDs: j.NamespaceIDs,
		Protected:    j.Protected,
		Tags:         j.Tags,
		Priority:     j.Priority,
		Isolation:    s.jobIsolation(j).Rank(),
		EnqueuedAt:   j.QueuedSince(),
		Data:         j,
	}
}

// setProjectMinimum records a project's minimum level and applies it to
// the project's jobs already in the queue.
func (s *Server) setProjectMinimum(projectID int64, l executor.Isolation) {
	if s.applyProjectMinimum(projectID, l) {
		s.publish(cluster.ProjectChanged, projectID)
	}
}

// applyProjectMinimum records a project's minimum level here and applies
// it to the queued jobs; it reports whether the minimum changed.
func (s *Server) applyProjectMinimum(projectID int64, l executor.Isolation) bool {
	if !s.isolation.setMinimum(projectID, l) {
		return false
	}
	s.requeueIsolation(projectID)
	return true
}

// requeueIsolation recomputes the level of the queued jobs of a project
// (0: of every project) after its minimum changed.
func (s *Server) requeueIsolation(projectID int64) {
	s.queue.UpdateIsolation(func(qj *queue.Job) int {
		j, ok := qj.Data.(*store.Job)
		if !ok || projectID != 0 && qj.ProjectID != projectID {
			return qj.Isolation
		}
		return s.jobIsolation(j).Rank()
	})
}

// loadIsolation reads the projects' minimums and the offers runner
// managers last made (for pending reasons right after a restart).
func (s *Server) loadIsolation(ctx context.Context) error {
	projects, err := s.store.ListProjects(ctx)
	if err != nil {
		return fmt.Errorf("loading project isolation minimums: %w", err)
	}
	for _, p := range projects {
		if l, err := parseIsolation(p.MinIsolation); err == nil {
			s.isolation.setMinimum(p.ID, l)
		}
	}
	return s.runners.LoadOffers(ctx)
}

// isolationWait is why a queued job waits for its isolation level.
type isolationWait struct {
	level executor.Isolation
	// offered are the levels offered by the online runners that could
	// run the job but for its isolation, weakest first; empty when there
	// are none.
	offered []executor.Isolation
}

// reason is the job's pending_reason.
func (w *isolationWait) reason() string {
	if len(w.offered) == 0 {
		return fmt.Sprintf("no runner offers isolation level %s (no online runner could take this job)", w.level)
	}
	return fmt.Sprintf("no runner offers isolation level %s (online runners offer: %s)", w.level, joinLevels(w.offered))
}

// logLine is the line GET …/trace shows for the job before it starts.
func (w *isolationWait) logLine() string {
	if len(w.offered) == 0 {
		return fmt.Sprintf("Waiting for a runner that offers isolation level %s: no online runner could take this job\n", w.level)
	}
	return fmt.Sprintf("Waiting for a runner that offers isolation level %s: no online runner offers it (offered: %s)\n", w.level, joinLevels(w.offered))
}

func joinLevels(ls []executor.Isolation) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = string(l)
	}
	return strings.Join(s, ", ")
}

// isolationWaitOf tells whether a queued job waits for its isolation
// level: it needs more than none, and no runner manager that asked within
// runners.OnlineWindow and may run the job otherwise (scope, tags, protected refs)
// offers that level or a stronger one. Nil otherwise, and for jobs that
// are not queued. It reads no store.
func (s *Server) isolationWaitOf(j *store.Job) *isolationWait {
	if j.Status != store.StatusPending || j.RunnerManagerID != 0 {
		return nil
	}
	qj := s.queueJob(j)
	if qj.Isolation == 0 {
		return nil
	}
	w := &isolationWait{level: executor.IsolationAt(qj.Isolation)}
	for _, o := range s.runners.Offers(s.clock.Now().Add(-runners.OnlineWindow)) {
		if !o.View.Admits(qj) {
			continue
		}
		if o.View.Isolation >= qj.Isolation {
			return nil
		}
		for _, l := range o.Levels {
			if !slices.Contains(w.offered, l) {
				w.offered = append(w.offered, l)
			}
		}
	}
	slices.SortFunc(w.offered, func(a, b executor.Isolation) int { return a.Rank() - b.Rank() })
	return w
}

// IsolationWait reports whether pending job j waits for a runner that
// offers its isolation level: the level, and the levels the online
// runners that could otherwise take it offer (none when no such runner
// asked recently).
func (s *Server) IsolationWait(j *store.Job) (level executor.Isolation, offered []executor.Isolation, waiting bool) {
	w := s.isolationWaitOf(j)
	if w == nil {
		return "", nil, false
	}
	return w.level, w.offered, true
}

// PendingReason is why a pending job is not handed out, when the
// coordinator knows ("" otherwise): the job's pending_reason.
func (s *Server) PendingReason(j *store.Job) string { return s.pendingReason(j) }

// pendingReason is a job's pending_reason: why a queued job is not handed
// out, when the coordinator knows ("" otherwise).
func (s *Server) pendingReason(j *store.Job) string {
	if w := s.isolationWaitOf(j); w != nil {
		return w.reason()
	}
	return ""
}
