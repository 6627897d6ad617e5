// Package runners is the coordinator's book of runners: it authenticates
// runner tokens without reading the store on the hot path, records the
// runner managers (one per system_id) and the isolation levels each last
// offered, mints runner tokens, and gives the queue its matching view of a
// runner.
//
// The store is the source of truth. A Registry caches runners by token
// digest for a short time; a change made through it is applied here at
// once and published to the other replicas sharing the store (Changed,
// Deleted), which forget their copies (Forget).
package runners

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	"github.com/berthci/berth/token"
)

// ErrForbidden is the answer to any failed authentication.
var ErrForbidden = errors.New("403 Forbidden")

// OnlineWindow: a runner that contacted the coordinator this recently is
// online (GitLab: 2 h). Offers of isolation levels count as long.
const OnlineWindow = 2 * time.Hour

// LegacyManager is the system_id GitLab records for runners that send
// none.
const LegacyManager = "<legacy>"

// CacheTTL bounds how long a cached runner may be stale with respect to
// changes made outside this process (a variable for tests).
var CacheTTL = 10 * time.Second

// managerWriteInterval: a runner manager's contacted_at is written at most
// this often.
const managerWriteInterval = time.Minute

// Clock tells the time.
type Clock interface{ Now() time.Time }

// Options are what a Registry works with.
type Options struct {
	Store   store.Store
	Queue   *queue.Queue
	Cluster cluster.Cluster
	Clock   Clock
	// TokenExpiresIn gives runner authentication tokens an expiry (0:
	// never).
	TokenExpiresIn time.Duration
	// Cell is the coordinator's cell (0: none): tokens minted carry it.
	Cell int64
}

// Registry is the runners as this replica knows them. It is safe for
// concurrent use.
type Registry struct {
	store          store.Store
	queue          *queue.Queue
	cluster        cluster.Cluster
	clock          Clock
	tokenExpiresIn time.Duration
	cell           int64

	mu       sync.Mutex
	cache    map[string]cachedRunner // by token digest
	managers map[ManagerRef]managerEntry
	offers   map[ManagerRef]Offer
	// fleets throttles the writes of fleet reports (fleet.go).
	fleets fleetWrites
}

type cachedRunner struct {
	r      *store.Runner
	q      []*queue.Runner // matching views of r by isolation rank, built once
	loaded time.Time
}

// ManagerRef names a runner manager: a runner and a system_id.
type ManagerRef struct {
	RunnerID int64
	SystemID string
}

type managerEntry struct {
	id      int64
	written time.Time
	info    []byte
}

// Offer is what one runner manager offered when it last asked for a job.
type Offer struct {
	// View is the runner's matching view at its strongest offered level.
	View *queue.Runner
	// Levels are the offered levels, weakest first, never empty.
	Levels []executor.Isolation
	Seen   time.Time
}

// New returns an empty registry over opts.Store.
func New(opts Options) *Registry {
	return &Registry{store: opts.Store, queue: opts.Queue, cluster: opts.Cluster, clock: opts.Clock,
		tokenExpiresIn: opts.TokenExpiresIn, cell: opts.Cell,
		cache: map[string]cachedRunner{}, managers: map[ManagerRef]managerEntry{}, offers: map[ManagerRef]Offer{}}
}

// Authenticate returns the runner a token belongs to. ErrForbidden for an
// empty, unknown or expired token.
func (r *Registry) Authenticate(ctx context.Context, tok string) (*store.Runner, error) {
	if tok == "" {
		return nil, ErrForbidden
	}
	digest := token.Digest(tok)
	rn, err := r.byDigest(ctx, digest)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrForbidden
	}
	if err != nil {
		return nil, err
	}
	if !token.Equal(rn.TokenDigest, digest) {
		return nil, ErrForbidden
	}
	if !rn.TokenExpiresAt.IsZero() && !r.clock.Now().Before(rn.TokenExpiresAt) {
		return nil, ErrForbidden
	}
	return rn, nil
}

func (r *Registry) byDigest(ctx context.Context, digest string) (*store.Runner, error) {
	r.mu.Lock()
	e, ok := r.cache[digest]
	r.mu.Unlock()
	if ok && time.Since(e.loaded) < CacheTTL {
		return e.r, nil
	}
	rn, err := r.store.RunnerByTokenDigest(ctx, digest)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.cache[digest] = cachedRunner{r: rn, q: queueViews(rn), loaded: time.Now()}
	r.mu.Unlock()
	return rn, nil
}

// QueueView returns the queue's matching view of a runner, as seen by a
// manager whose strongest offered isolation level is offered.
func (r *Registry) QueueView(rn *store.Runner, offered executor.Isolation) *queue.Runner {
	rank := max(offered.Rank(), 0)
	r.mu.Lock()
	e, ok := r.cache[rn.TokenDigest]
	r.mu.Unlock()
	if ok && e.r == rn {
		return e.q[rank]
	}
	return queueViews(rn)[rank]
}

// Changed forgets this replica's and the other replicas' copies of a
// runner that was changed (its token, pause, tags, projects): the next
// request reads it again, and the queue forgets its view.
func (r *Registry) Changed(rn *store.Runner) {
	r.mu.Lock()
	delete(r.cache, rn.TokenDigest)
	r.mu.Unlock()
	r.queue.Forget(rn.ID)
	r.cluster.Publish(cluster.Event{Kind: cluster.RunnerChanged, ID: rn.ID})
}

// Deleted drops everything this replica remembers of a deleted runner
// (and, through the cluster, the other replicas' copies).
func (r *Registry) Deleted(rn *store.Runner) {
	r.ForgetManager(rn.ID, "")
	r.Changed(rn)
}

// Forget drops this replica's copy of a runner another replica changed.
func (r *Registry) Forget(id int64) {
	r.mu.Lock()
	for d, e := range r.cache {
		if e.r.ID == id {
			delete(r.cache, d)
		}
	}
	r.mu.Unlock()
	r.queue.Forget(id)
}

// ForgetAll drops every cached runner (after cluster events were lost).
func (r *Registry) ForgetAll() {
	r.mu.Lock()
	clear(r.cache)
	r.mu.Unlock()
}

// TouchManager returns the id of the manager record of (runner,
// systemID), creating it or refreshing its contact time and info when
// due.
func (r *Registry) TouchManager(ctx context.Context, rn *store.Runner, systemID string, info *runnerapi.Info) (int64, error) {
	if systemID == "" {
		systemID = LegacyManager
	}
	var infoJSON []byte
	if info != nil {
		infoJSON, _ = json.Marshal(info)
	}
	ref := ManagerRef{rn.ID, systemID}
	now := r.clock.Now()
	r.mu.Lock()
	e, ok := r.managers[ref]
	r.mu.Unlock()
	if ok && now.Sub(e.written) < managerWriteInterval && (infoJSON == nil || bytes.Equal(infoJSON, e.info)) {
		return e.id, nil
	}
	m := &store.RunnerManager{RunnerID: rn.ID, SystemID: systemID, Info: infoJSON, ContactedAt: now}
	if infoJSON == nil && ok {
		m.Info = e.info
	}
	if err := r.store.UpsertRunnerManager(ctx, m); err != nil {
		return 0, err
	}
	r.mu.Lock()
	r.managers[ref] = managerEntry{id: m.ID, written: now, info: m.Info}
	r.mu.Unlock()
	return m.ID, nil
}

// ForgetManager drops what is remembered of a runner's manager (its
// record's id, its offer), or of all its managers when systemID is empty.
func (r *Registry) ForgetManager(runnerID int64, systemID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ref := range r.managers {
		if ref.RunnerID == runnerID && (systemID == "" || ref.SystemID == systemID) {
			delete(r.managers, ref)
		}
	}
	for ref := range r.offers {
		if ref.RunnerID == runnerID && (systemID == "" || ref.SystemID == systemID) {
			delete(r.offers, ref)
		}
	}
}

// OfferedLevels are the known levels a runner names in
// info.isolation_levels, weakest first, without duplicates; none when it
// names none (the real gitlab-runner never does). Unknown names are
// ignored: a newer runner may know levels this coordinator does not.
func OfferedLevels(info *runnerapi.Info) []executor.Isolation {
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

// NoteOffer records the levels a runner manager offers (from the info of
// its request) and returns the runner's matching view at the strongest. A
// paused runner offers nothing.
func (r *Registry) NoteOffer(rn *store.Runner, systemID string, info *runnerapi.Info) *queue.Runner {
	if systemID == "" {
		systemID = LegacyManager
	}
	levels := OfferedLevels(info)
	view := r.QueueView(rn, levels[len(levels)-1])
	ref := ManagerRef{rn.ID, systemID}
	r.mu.Lock()
	defer r.mu.Unlock()
	if rn.Paused {
		delete(r.offers, ref)
		return view
	}
	r.offers[ref] = Offer{View: view, Levels: levels, Seen: r.clock.Now()}
	return view
}

// Offers returns the offers made since.
func (r *Registry) Offers(since time.Time) []Offer {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Offer
	for _, o := range r.offers {
		if !o.Seen.Before(since) {
			out = append(out, o)
		}
	}
	return out
}

// StrongestOffer returns the strongest level a runner's managers offered
// since, and whether any did.
func (r *Registry) StrongestOffer(runnerID int64, since time.Time) (executor.Isolation, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var best executor.Isolation
	for ref, o := range r.offers {
		if ref.RunnerID == runnerID && !o.Seen.Before(since) {
			best = executor.StrongerIsolation(best, o.Levels[len(o.Levels)-1])
		}
	}
	return best, best != ""
}

// LoadOffers reads the offers runner managers last made within
// OnlineWindow (for pending reasons right after a restart).
func (r *Registry) LoadOffers(ctx context.Context) error {
	runners, err := r.store.ListRunners(ctx)
	if err != nil {
		return fmt.Errorf("loading runner offers: %w", err)
	}
	since := r.clock.Now().Add(-OnlineWindow)
	for _, rn := range runners {
		if rn.Paused {
			continue
		}
		ms, err := r.store.ListRunnerManagers(ctx, rn.ID)
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
			levels := OfferedLevels(&info)
			o := Offer{View: r.QueueView(rn, levels[len(levels)-1]), Levels: levels, Seen: m.ContactedAt}
			r.mu.Lock()
			r.offers[ManagerRef{rn.ID, m.SystemID}] = o
			r.mu.Unlock()
		}
	}
	return nil
}

// MintToken mints an authentication token of the right kind for a
// runner: glrt- with its scope's marker, or glrtr- for a runner
// registered with a registration token. In a cell the token is routable
// (token.NewRoutable): it carries the cell, the organization and the
// runner's group or project, as GitLab's routable runner tokens do.
func (r *Registry) MintToken(rn *store.Runner) (string, error) {
	prefix := token.PrefixRunnerAuthLegacy
	scope := token.ScopeInstance
	switch rn.Type {
	case store.GroupType:
		scope = token.ScopeGroup
	case store.ProjectType:
		scope = token.ScopeProject
	}
	if !rn.Legacy {
		prefix = token.RunnerAuthPrefix(scope)
	}
	if r.cell == 0 {
		if rn.Legacy {
			return token.NewRunnerAuthLegacy(), nil
		}
		return token.NewRunnerAuth(scope), nil
	}
	routing := token.Routing{Cell: r.cell, Organization: 1}
	switch rn.Type {
	case store.GroupType:
		routing.Group = rn.GroupID
	case store.ProjectType:
		if len(rn.ProjectIDs) > 0 {
			routing.Project = rn.ProjectIDs[0]
		}
	}
	return token.NewRoutable(prefix, routing)
}

// MintPersonalToken mints a user's personal access token (glpat-),
// routable in a cell so that a router takes the user's requests to it.
func (r *Registry) MintPersonalToken() (string, error) {
	if r.cell == 0 {
		return token.NewPersonal(), nil
	}
	return token.NewRoutable(token.PrefixPersonal, token.Routing{Cell: r.cell, Organization: 1})
}

// MintTriggerToken mints a pipeline trigger token (glptt-…), routable in
// a cell.
func (r *Registry) MintTriggerToken() (string, error) {
	if r.cell == 0 {
		return token.NewTrigger(), nil
	}
	return token.NewRoutable(token.PrefixTrigger, token.Routing{Cell: r.cell, Organization: 1})
}

// MintRegistrationToken mints a registration token (GR1348941…),
// routable in a cell.
func (r *Registry) MintRegistrationToken() (string, error) {
	if r.cell == 0 {
		return token.NewRegistration(), nil
	}
	return token.NewRoutable(token.PrefixRegistration, token.Routing{Cell: r.cell, Organization: 1})
}

// TokenExpiry is when a token minted at now expires (zero: never).
func (r *Registry) TokenExpiry(now time.Time) time.Time {
	if r.tokenExpiresIn <= 0 {
		return time.Time{}
	}
	return now.Add(r.tokenExpiresIn).Truncate(time.Second)
}

// queueViews returns the queue's matching views of a runner, one per
// isolation rank (index: executor.Isolation.Rank()), sharing their maps.
func queueViews(rn *store.Runner) []*queue.Runner {
	base := queueRunner(rn)
	out := make([]*queue.Runner, len(executor.Isolations))
	for i := range out {
		v := *base
		v.Isolation = i
		out[i] = &v
	}
	return out
}

// queueRunner converts a runner to the queue's matching view (offering
// isolation none).
func queueRunner(rn *store.Runner) *queue.Runner {
	q := &queue.Runner{
		ID:            rn.ID,
		GroupID:       rn.GroupID,
		RunUntagged:   rn.RunUntagged,
		ProtectedOnly: rn.AccessLevel == store.RefProtected,
		Tags:          make(map[string]bool, len(rn.Tags)),
	}
	switch rn.Type {
	case store.GroupType:
		q.Scope = queue.Group
	case store.ProjectType:
		q.Scope = queue.Project
		q.ProjectIDs = make(map[int64]bool, len(rn.ProjectIDs))
		for _, id := range rn.ProjectIDs {
			q.ProjectIDs[id] = true
		}
	}
	for _, t := range rn.Tags {
		q.Tags[t] = true
	}
	return q
}

// Cached reports whether the runner of a token is in this replica's
// cache (for tests and diagnostics).
func (r *Registry) Cached(tok string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.cache[token.Digest(tok)]
	return ok
}

// ParseAccessLevel reads a runner's access_level as GitLab's API takes
// it: not_protected (the default) or ref_protected.
func ParseAccessLevel(a string) (store.AccessLevel, bool) {
	switch a {
	case "", string(store.NotProtected):
		return store.NotProtected, true
	case string(store.RefProtected):
		return store.RefProtected, true
	}
	return "", false
}
