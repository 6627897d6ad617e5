package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/queue"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runnerapi"
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

// offerWindow: a runner manager that asked for jobs this recently counts
// when a pending job's reason is worked out. The same window as a runner's
// online status (GitLab's 2 h), so "online" means one thing in Berth.
const offerWindow = onlineWindow

// parseIsolation parses a level named through the API; empty means none
// was named and is returned as is.
func parseIsolation(s string) (executor.Isolation, error) {
	if s == "" {
		return "", nil
	}
	return executor.ParseIsolation(s)
}

// strongerIsolation returns the stronger of two levels; an empty level
// (none named) loses to any other.
func strongerIsolation(a, b executor.Isolation) executor.Isolation {
	if a == "" || (b != "" && b.Rank() > a.Rank()) {
		return b
	}
	return a
}

// levelAt returns the level of a rank (clamped to the known levels).
func levelAt(rank int) executor.Isolation {
	return executor.Isolations[min(max(rank, 0), len(executor.Isolations)-1)]
}

// offeredLevels are the known levels a runner names in
// info.isolation_levels, weakest first, without duplicates; none when it
// names none (the real gitlab-runner never does). Unknown names are
// ignored: a newer runner may know levels this coordinator does not.
func offeredLevels(info *runnerapi.Info) []executor.Isolation {
	var out []executor.Isolation
	if info != nil {
		for _, s := range info.IsolationLevels {
			if l, err := executor.ParseIsolation(strings.TrimSpace(s)); err == nil && !slices.Contains(out, l) {
				out = append(out, l)
			}
		}
	}
	if len(out) == 0 {
		return []executor.Isolation{executor.IsolationNone}
	}
	slices.SortFunc(out, func(a, b executor.Isolation) int { return a.Rank() - b.Rank() })
	return out
}

// offer is what one runner manager offered when it last asked.
type offer struct {
	view   *queue.Runner // the runner's matching view at its strongest level
	levels []executor.Isolation
	seen   time.Time
}

// isolationBook holds the offers of runner managers and the projects'
// minimum levels. It is safe for concurrent use.
type isolationBook struct {
	mu       sync.Mutex
	offers   map[managerRef]offer
	minimums map[int64]executor.Isolation // project id → minimum (absent: none)
}

func (b *isolationBook) init() {
	b.offers = map[managerRef]offer{}
	b.minimums = map[int64]executor.Isolation{}
}

func (b *isolationBook) note(ref managerRef, o offer) {
	b.mu.Lock()
	b.offers[ref] = o
	b.mu.Unlock()
}

// forget drops the offers of a runner's manager, or of all its managers
// when systemID is empty.
func (b *isolationBook) forget(runnerID int64, systemID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ref := range b.offers {
		if ref.runnerID == runnerID && (systemID == "" || ref.systemID == systemID) {
			delete(b.offers, ref)
		}
	}
}

// recent returns the offers seen since.
func (b *isolationBook) recent(since time.Time) []offer {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []offer
	for _, o := range b.offers {
		if !o.seen.Before(since) {
			out = append(out, o)
		}
	}
	return out
}

// strongestOf returns the strongest level a runner's managers offered
// since, and whether any did.
func (b *isolationBook) strongestOf(runnerID int64, since time.Time) (executor.Isolation, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var best executor.Isolation
	for ref, o := range b.offers {
		if ref.runnerID == runnerID && !o.seen.Before(since) {
			best = strongerIsolation(best, o.levels[len(o.levels)-1])
		}
	}
	return best, best != ""
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
	l := strongerIsolation(asked, s.isolation.minimum(j.ProjectID))
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

// noteOffer records the levels a runner manager offers (from the info of
// its request) and returns the runner's matching view at the strongest. A
// paused runner offers nothing.
func (s *Server) noteOffer(rn *store.Runner, systemID string, info *runnerapi.Info) *queue.Runner {
	if systemID == "" {
		systemID = legacyManager
	}
	levels := offeredLevels(info)
	view := s.runners.queueView(rn, levels[len(levels)-1])
	if rn.Paused {
		s.isolation.forget(rn.ID, systemID)
		return view
	}
	s.isolation.note(managerRef{rn.ID, systemID}, offer{view: view, levels: levels, seen: s.clock.Now()})
	return view
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
	runners, err := s.store.ListRunners(ctx)
	if err != nil {
		return fmt.Errorf("loading runner offers: %w", err)
	}
	since := s.clock.Now().Add(-offerWindow)
	for _, rn := range runners {
		if rn.Paused {
			continue
		}
		ms, err := s.store.ListRunnerManagers(ctx, rn.ID)
		if err != nil {
			return fmt.Errorf("loading runner offers: %w", err)
		}
		for _, m := range ms {
			if m.ContactedAt.Before(since) {
				continue
			}
			var info runnerapi.Info
			if len(m.Info) > 0 {
				_ = json.Unmarshal(m.Info, &info) // an unreadable info offers none
			}
			levels := offeredLevels(&info)
			s.isolation.note(managerRef{rn.ID, m.SystemID}, offer{
				view: s.runners.queueView(rn, levels[len(levels)-1]), levels: levels, seen: m.ContactedAt,
			})
		}
	}
	return nil
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
// offerWindow and may run the job otherwise (scope, tags, protected refs)
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
	w := &isolationWait{level: levelAt(qj.Isolation)}
	for _, o := range s.isolation.recent(s.clock.Now().Add(-offerWindow)) {
		if !o.view.Admits(qj) {
			continue
		}
		if o.view.Isolation >= qj.Isolation {
			return nil
		}
		for _, l := range o.levels {
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
