// Package queue is the coordinator's in-memory dispatch index: the backlog
// of pending jobs and the runner requests held waiting for one.
//
// The store is the source of truth; the queue is rebuilt from it on start
// and only decides *who gets what next*. A job pushed while eligible
// requests are waiting is handed to one of them directly (a wake-up, not a
// polling loop). Persisting the assignment — the conditional store write
// that makes it exactly-once even across processes — is the caller's job.
//
// Matching: a runner may run a job when its scope, tags and access level
// admit it (Runner.Admits) and it offers the isolation the job needs: the
// rank of the strongest isolation level it offers is at least the job's
// (Runner.CanRun). Ranks are executor.Isolation.Rank(): 0 none, 1
// cgroups, 2 container, 3 microvm, 4 vm, 5 instance.
//
// Order: higher Priority first, then FIFO (lower ID first).
// Fairness: when several held requests may run a job, it goes to the one
// whose runner manager has the fewest jobs in flight, then to the one that
// has waited longest (comparing the first fairnessWindow eligible
// requests), so work spreads across managers instead of the first host
// grabbing it.
//
// All methods are safe for concurrent use.
package queue

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Job is what the queue needs to know of a pending job to match it.
type Job struct {
	ID           int64
	ProjectID    int64
	NamespaceIDs []int64
	Protected    bool
	Tags         []string // normalized (sorted, unique)
	Priority     int
	// Isolation is the rank of the isolation level the job needs
	// (executor.Isolation.Rank(); 0 is none).
	Isolation  int
	EnqueuedAt time.Time
	// Data is opaque to the queue: the caller's record of the job, handed
	// back with it.
	Data any
	// Assigned is not nil for a job stored already handed to the request
	// it is delivered to (Claim): the caller's record of that assignment.
	// Such a job never enters the backlog, and a request that gives up
	// still takes it (its caller releases it).
	Assigned any

	elem  *list.Element
	level *level
}

// Scope of a runner.
type Scope int

// Runner scopes.
const (
	Instance Scope = iota
	Group
	Project
)

// Runner is what the queue needs to know of a runner to match jobs.
type Runner struct {
	ID            int64
	Scope         Scope
	GroupID       int64
	ProjectIDs    map[int64]bool
	Tags          map[string]bool
	RunUntagged   bool
	ProtectedOnly bool
	// Isolation is the rank of the strongest isolation level the runner
	// offers (executor.Isolation.Rank(); 0 is none). Runners of one token
	// whose managers offer different levels are different views, each
	// with its own queue version.
	Isolation int

	sig string // matching signature, computed once under the queue lock
}

// signature identifies what a runner may run: runners with equal
// signatures match exactly the same jobs and share a queue version.
func (r *Runner) signature() string {
	if r.sig != "" {
		return r.sig
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d|%d|%t|%t|%d|", r.Scope, r.GroupID, r.RunUntagged, r.ProtectedOnly, r.Isolation)
	ids := make([]int64, 0, len(r.ProjectIDs))
	for id, ok := range r.ProjectIDs {
		if ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "%d,", id)
	}
	b.WriteByte('|')
	tags := make([]string, 0, len(r.Tags))
	for t, ok := range r.Tags {
		if ok {
			tags = append(tags, t)
		}
	}
	slices.Sort(tags)
	for _, t := range tags {
		b.WriteString(strconv.Quote(t))
	}
	r.sig = b.String()
	return r.sig
}

// class is the set of known runners sharing one signature, with their
// common queue version.
type class struct {
	rep     *Runner
	version uint64
	runners int
}

// CanRun reports whether the runner may run the job: Admits, and the
// runner offers the job's isolation level or a stronger one.
func (r *Runner) CanRun(j *Job) bool {
	return r.Isolation >= j.Isolation && r.Admits(j)
}

// Admits reports whether the runner may run the job as far as scope, tags
// and protected refs go, whatever isolation it needs.
func (r *Runner) Admits(j *Job) bool {
	switch r.Scope {
	case Group:
		found := false
		for _, id := range j.NamespaceIDs {
			if id == r.GroupID {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	case Project:
		if !r.ProjectIDs[j.ProjectID] {
			return false
		}
	}
	if r.ProtectedOnly && !j.Protected {
		return false
	}
	if len(j.Tags) == 0 {
		return r.RunUntagged
	}
	for _, t := range j.Tags {
		if !r.Tags[t] {
			return false
		}
	}
	return true
}

// Request is one runner manager asking for a job.
type Request struct {
	Runner *Runner
	// Manager identifies the runner manager (machine) for fairness.
	Manager string
}

type level struct {
	priority int
	jobs     list.List // of *Job, ascending ID
}

type waiter struct {
	req  Request
	got  chan *Job // buffered, 1
	elem *list.Element
}

// Queue is the dispatch index. The zero value is not usable; call New.
type Queue struct {
	mu       sync.Mutex
	levels   []*level // descending priority
	byID     map[int64]*Job
	waiters  list.List // of *waiter, oldest first
	inflight map[string]int
	runners  map[runnerKey]*class // runner views seen, for queue versions
	classes  map[string]*class
	epoch    string
	closed   bool
}

// runnerKey identifies a runner view: one runner seen at one isolation
// rank.
type runnerKey struct {
	id        int64
	isolation int
}

func keyOf(r *Runner) runnerKey { return runnerKey{r.ID, r.Isolation} }

// New returns an empty queue. Queue versions carry a random epoch so that a
// version issued by an earlier process never matches.
func New() *Queue {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return &Queue{
		byID:     map[int64]*Job{},
		inflight: map[string]int{},
		runners:  map[runnerKey]*class{},
		classes:  map[string]*class{},
		epoch:    hex.EncodeToString(b),
	}
}

// Push adds a pending job. If a held request may run it, the job is handed
// to that request at once and never enters the backlog. Pushing an ID that
// is already queued is a no-op.
func (q *Queue) Push(j *Job) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.byID[j.ID]; ok || q.closed {
		return
	}
	if w := q.pickWaiterLocked(j); w != nil {
		q.waiters.Remove(w.elem)
		w.elem = nil
		q.inflight[w.req.Manager]++
		w.got <- j
		return
	}
	q.insertLocked(j)
	for _, c := range q.classes {
		if c.rep.CanRun(j) {
			c.version++
		}
	}
}

// fairnessWindow bounds how many eligible held requests are compared when
// a job arrives, so a hand-off stays cheap with thousands of waiters.
const fairnessWindow = 64

// pickWaiterLocked chooses the held request for j: among the fairnessWindow
// longest-waiting requests that may run it, the one whose manager has the
// fewest jobs in flight (the longest-waiting on a tie).
func (q *Queue) pickWaiterLocked(j *Job) *waiter {
	var best *waiter
	bestLoad, seen := 0, 0
	for e := q.waiters.Front(); e != nil && seen < fairnessWindow; e = e.Next() {
		w := e.Value.(*waiter)
		if !w.req.Runner.CanRun(j) {
			continue
		}
		seen++
		load := q.inflight[w.req.Manager]
		if best == nil || load < bestLoad {
			best, bestLoad = w, load
			if load == 0 {
				break
			}
		}
	}
	return best
}

func (q *Queue) insertLocked(j *Job) {
	i := sort.Search(len(q.levels), func(i int) bool { return q.levels[i].priority <= j.Priority })
	var lv *level
	if i < len(q.levels) && q.levels[i].priority == j.Priority {
		lv = q.levels[i]
	} else {
		lv = &level{priority: j.Priority}
		q.levels = append(q.levels, nil)
		copy(q.levels[i+1:], q.levels[i:])
		q.levels[i] = lv
	}
	// Keep ascending ID order; new jobs almost always go last.
	e := lv.jobs.Back()
	for e != nil && e.Value.(*Job).ID > j.ID {
		e = e.Prev()
	}
	if e == nil {
		j.elem = lv.jobs.PushFront(j)
	} else {
		j.elem = lv.jobs.InsertAfter(j, e)
	}
	j.level = lv
	q.byID[j.ID] = j
}

func (q *Queue) removeLocked(j *Job) {
	j.level.jobs.Remove(j.elem)
	if j.level.jobs.Len() == 0 {
		for i, lv := range q.levels {
			if lv == j.level {
				q.levels = append(q.levels[:i], q.levels[i+1:]...)
				break
			}
		}
	}
	j.elem, j.level = nil, nil
	delete(q.byID, j.ID)
}

func (q *Queue) takeLocked(r *Runner) *Job {
	for _, lv := range q.levels {
		for e := lv.jobs.Front(); e != nil; e = e.Next() {
			j := e.Value.(*Job)
			if r.CanRun(j) {
				q.removeLocked(j)
				return j
			}
		}
	}
	return nil
}

// Take returns the first backlog job the request's runner may run. If there
// is none and hold > 0 it waits up to hold for one to be pushed. It returns
// nil when there is no job, when ctx ends (a job handed over at that moment
// goes back to the queue) or when the queue is closed.
//
// Every job Take returns counts as in flight on req.Manager until Done.
func (q *Queue) Take(ctx context.Context, req Request, hold time.Duration) *Job {
	q.mu.Lock()
	q.noteRunnerLocked(req.Runner)
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	if j := q.takeLocked(req.Runner); j != nil {
		q.inflight[req.Manager]++
		q.mu.Unlock()
		return j
	}
	if hold <= 0 {
		q.mu.Unlock()
		return nil
	}
	w := &waiter{req: req, got: make(chan *Job, 1)}
	w.elem = q.waiters.PushBack(w)
	q.mu.Unlock()

	timer := time.NewTimer(hold)
	defer timer.Stop()
	select {
	case j := <-w.got:
		return j
	case <-timer.C:
		return q.leave(w, false)
	case <-ctx.Done():
		return q.leave(w, true)
	}
}

// leave withdraws a waiter. If a job was handed to it meanwhile, the job is
// returned (keep, or a job assigned at creation) or put back (abandon).
func (q *Queue) leave(w *waiter, abandon bool) *Job {
	q.mu.Lock()
	if w.elem != nil {
		q.waiters.Remove(w.elem)
		w.elem = nil
		q.mu.Unlock()
		return nil
	}
	q.mu.Unlock()
	// Out of the list: a job was handed over (Push), or is about to be
	// (a Claim, delivered or canceled after its store write).
	j := <-w.got
	if j == nil {
		return nil // closed, or a claim canceled
	}
	if abandon && j.Assigned == nil {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.inflight[w.req.Manager]--
		if !q.closed {
			q.insertLocked(j)
		}
		return nil
	}
	return j
}

// Claim is a held request reserved for a job about to be stored already
// handed to it (so the store takes one write, not an insert and then an
// assignment). Exactly one of Deliver and Cancel must follow.
type Claim struct {
	q *Queue
	w *waiter
	// Request is the held request: the job is to be assigned to its
	// runner and manager.
	Request Request
}

// Claim reserves the held request Push would hand j to (the same choice,
// fairness included), or returns nil when no held request may run j. The
// request leaves the waiters and counts j in flight on its manager; j is
// not queued (its ID may not be known yet).
func (q *Queue) Claim(j *Job) *Claim {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil
	}
	w := q.pickWaiterLocked(j)
	if w == nil {
		return nil
	}
	q.waiters.Remove(w.elem)
	w.elem = nil
	q.inflight[w.req.Manager]++
	return &Claim{q: q, w: w, Request: w.req}
}

// Deliver hands j, stored assigned to the claim's request (j.Assigned set),
// to that request.
func (c *Claim) Deliver(j *Job) { c.w.got <- j }

// Cancel gives the claim up (the job could not be stored): the request
// ends without a job, its caller asks again.
func (c *Claim) Cancel() {
	c.q.Done(c.w.req.Manager)
	c.w.got <- nil
}

// Requeue puts a job handed out by Take back (its assignment could not be
// persisted or was never acknowledged) and ends its in-flight count.
func (q *Queue) Requeue(j *Job, manager string) {
	q.Done(manager)
	j.elem, j.level = nil, nil
	q.Push(j)
}

// Done ends the in-flight count of one job of a manager (the job finished
// or went back to the queue).
func (q *Queue) Done(manager string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n := q.inflight[manager]; n > 1 {
		q.inflight[manager] = n - 1
	} else {
		delete(q.inflight, manager)
	}
}

// MarkInFlight counts a job as in flight on a manager (used when rebuilding
// the queue from the store).
func (q *Queue) MarkInFlight(manager string) {
	q.mu.Lock()
	q.inflight[manager]++
	q.mu.Unlock()
}

// Remove drops a pending job from the backlog (it was canceled). It reports
// whether the job was queued.
func (q *Queue) Remove(id int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	j, ok := q.byID[id]
	if ok {
		q.removeLocked(j)
	}
	return ok
}

// Has reports whether a job is in the backlog.
func (q *Queue) Has(id int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	_, ok := q.byID[id]
	return ok
}

// IDs lists the jobs in the backlog, in no particular order.
func (q *Queue) IDs() []int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	ids := make([]int64, 0, len(q.byID))
	for id := range q.byID {
		ids = append(ids, id)
	}
	return ids
}

// Version is the queue version of a runner view (its ID and isolation),
// echoed by runners as last_update. It changes whenever a job the view may
// run enters the backlog.
func (q *Queue) Version(r *Runner) string {
	q.mu.Lock()
	var v uint64
	if c := q.runners[keyOf(r)]; c != nil {
		v = c.version
	}
	q.mu.Unlock()
	return q.epoch + "-" + strconv.FormatUint(v, 10)
}

// Forget drops what the queue remembers of a runner, at every isolation
// (deleted or paused).
func (q *Queue) Forget(runnerID int64) {
	q.mu.Lock()
	for k := range q.runners {
		if k.id == runnerID {
			q.forgetLocked(k)
		}
	}
	q.mu.Unlock()
}

// noteRunnerLocked puts a runner view into the class of its signature.
func (q *Queue) noteRunnerLocked(r *Runner) {
	sig := r.signature()
	k := keyOf(r)
	if c := q.runners[k]; c != nil {
		if c.rep.signature() == sig {
			return
		}
		q.forgetLocked(k)
	}
	c := q.classes[sig]
	if c == nil {
		c = &class{rep: r}
		q.classes[sig] = c
	}
	c.runners++
	q.runners[k] = c
}

func (q *Queue) forgetLocked(k runnerKey) {
	c := q.runners[k]
	if c == nil {
		return
	}
	delete(q.runners, k)
	if c.runners--; c.runners == 0 {
		delete(q.classes, c.rep.signature())
	}
}

// UpdateIsolation recomputes the isolation rank of every job in the
// backlog with level (called with the queue locked: it must not call the
// queue), after a project's minimum level changed. A job that needs less
// than before is handed at once to a held request that may now run it;
// otherwise the versions of the runners that may now run it move on.
func (q *Queue) UpdateIsolation(level func(j *Job) int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range q.byID {
		n := level(j)
		if n == j.Isolation {
			continue
		}
		raised := n > j.Isolation
		j.Isolation = n
		if raised {
			continue // only runners that could run it already still can
		}
		if w := q.pickWaiterLocked(j); w != nil {
			q.removeLocked(j)
			q.waiters.Remove(w.elem)
			w.elem = nil
			q.inflight[w.req.Manager]++
			w.got <- j
			continue
		}
		for _, c := range q.classes {
			if c.rep.CanRun(j) {
				c.version++
			}
		}
	}
}

// Len is the number of jobs in the backlog.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.byID)
}

// Waiting is the number of held requests.
func (q *Queue) Waiting() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiters.Len()
}

// TagSetStats summarises the backlog for one set of tags.
type TagSetStats struct {
	Tags       []string
	Queued     int
	OldestWait time.Duration
}

// Stats summarises the backlog by tag set, optionally only jobs the runner
// may run (r nil: all), ordered by tag set.
func (q *Queue) Stats(now time.Time, r *Runner) []TagSetStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	byKey := map[string]*TagSetStats{}
	for _, j := range q.byID {
		if r != nil && !r.CanRun(j) {
			continue
		}
		key := strings.Join(j.Tags, ",")
		s := byKey[key]
		if s == nil {
			s = &TagSetStats{Tags: append([]string{}, j.Tags...)}
			byKey[key] = s
		}
		s.Queued++
		if w := now.Sub(j.EnqueuedAt); w > s.OldestWait {
			s.OldestWait = w
		}
	}
	out := make([]TagSetStats, 0, len(byKey))
	for _, s := range byKey {
		out = append(out, *s)
	}
	sort.Slice(out, func(a, b int) bool {
		return strings.Join(out[a].Tags, ",") < strings.Join(out[b].Tags, ",")
	})
	return out
}

// Closed reports whether Close was called.
func (q *Queue) Closed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// Close releases every held request with no job; later Takes return nil
// at once. Used to drain long polls on shutdown.
func (q *Queue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for e := q.waiters.Front(); e != nil; e = e.Next() {
		w := e.Value.(*waiter)
		w.elem = nil
		w.got <- nil
	}
	q.waiters.Init()
}

// NormalizeTags trims, de-duplicates and sorts tags.
func NormalizeTags(tags []string) []string {
	seen := map[string]bool{}
	out := []string{}
	for _, t := range tags {
		t = strings.TrimSpace(t)
		if t != "" && !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out
}
