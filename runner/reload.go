package runner

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/runner/config"
	"github.com/berthci/berth/taskscaler"
	"github.com/berthci/berth/token"
)

// ReloadResult says what a reload changed.
type ReloadResult struct {
	// Added, Removed, Replaced and Retuned name the [[runners]] entries
	// (by short token) that were started, stopped, restarted with their
	// new settings, and whose autoscaler policies were changed in place.
	Added, Removed, Replaced, Retuned []string
	// Concurrent is the bound on jobs at once now.
	Concurrent int
	// Restart lists the changed keys a reload cannot apply (the process
	// must be restarted for them).
	Restart []string
	// Changed: anything the manager runs by changed (a file rewritten
	// with the same settings, as a token rotation does, changes nothing).
	Changed bool
}

// policySetter is an autoscaled provider whose policies change in place
// (taskscaler.Scaler.SetPolicies).
type policySetter interface {
	SetPolicies([]taskscaler.Policy) error
}

// retireTimeout bounds a retired provider's shutdown.
const retireTimeout = 5 * time.Minute

// Reload applies a new configuration to the manager while it runs, as
// gitlab-runner does when its config.toml changes. load reads it; it is
// called with the manager's configuration locked, so that a token the
// manager is rotating meanwhile is read as written. Then:
//
//   - concurrent, check_interval and shutdown_timeout apply at once
//     (lowering concurrent takes no job back: no new job starts until
//     enough ended);
//   - a new [[runners]] entry (a token not served yet) starts asking for
//     jobs; an entry gone stops asking, its running jobs finish, then its
//     executor is shut down;
//   - an entry whose autoscaler policies alone changed keeps its
//     executor and instances, and takes the new policies;
//   - an entry changed otherwise is restarted: the old one stops asking
//     and finishes its jobs, a new one with the new settings asks at once
//     — for executors holding shared state (instance, docker-autoscaler,
//     microvm, plugins: an instance group, a nesting daemon) only once the
//     old one's jobs ended and its executor shut down, so two never
//     manage the same resources.
//
// On any error (the file does not load, an executor cannot be made)
// nothing changes. listen_address and the log settings are the caller's
// (Restart names what a restart would apply).
func (m *Manager) Reload(load func() (*config.Config, error)) (ReloadResult, error) {
	m.cfgMu.Lock()
	defer m.cfgMu.Unlock()
	next, err := load()
	if err != nil {
		return ReloadResult{}, err
	}
	if err := next.Validate(); err != nil {
		return ReloadResult{}, fmt.Errorf("runner config: %w", err)
	}
	prev := m.cfg
	res := ReloadResult{Concurrent: next.Concurrent}
	if prev.ListenAddress != next.ListenAddress {
		res.Restart = append(res.Restart, "listen_address")
	}
	if prev.LogFormat != next.LogFormat {
		res.Restart = append(res.Restart, "log_format")
	}

	current := m.currentWorkers()
	byToken := map[string]*worker{}
	for _, w := range current {
		byToken[w.rc.Token] = w
	}
	type retune struct {
		w  *worker
		ps []taskscaler.Policy
	}
	type successor struct {
		w  *worker
		rc *config.Runner
	}
	var successors []successor
	type replacement struct {
		old  *worker
		next *worker // nil: made once old is done (exclusive executors)
		rc   *config.Runner
	}
	var (
		workers  []*worker
		added    []*worker
		replaced []replacement
		retuned  []retune
		kept     = map[*worker]bool{}
	)
	// Make every new executor first: a failure changes nothing.
	fail := func(err error) (ReloadResult, error) {
		for _, w := range added {
			_ = w.shutdown(context.Background())
		}
		for _, r := range replaced {
			if r.next != nil {
				_ = r.next.shutdown(context.Background())
			}
		}
		return ReloadResult{}, err
	}
	for i, rc := range next.Runners {
		if !config.Supported(rc.Executor) {
			m.log.Warn("runner skipped: its executor is not supported by Berth yet", "name", rc.Name, "runner", token.Short(rc.Token), "executor", rc.Executor)
			continue
		}
		w := byToken[rc.Token]
		switch {
		case w != nil && !kept[w] && w.retired.Load():
			// An exclusive entry waiting for its old executor to finish:
			// its successor takes these settings.
			kept[w] = true
			workers = append(workers, w)
			if !reflect.DeepEqual(w.successor, rc) {
				successors = append(successors, successor{w, rc})
			}
		case w == nil || kept[w]:
			nw, err := m.newWorker(rc, nil)
			if err != nil {
				return fail(err)
			}
			added = append(added, nw)
			workers = append(workers, nw)
		case reflect.DeepEqual(w.rc, rc):
			kept[w] = true
			next.Runners[i] = w.rc // token rotations keep editing the live entry
			workers = append(workers, w)
		case policiesAlone(w.rc, rc) && isPolicySetter(w.provider):
			kept[w] = true
			// w.rc takes the new policies below, once they are in force.
			retuned = append(retuned, retune{w, rc.Autoscaler.Policies})
			workers = append(workers, w)
			next.Runners[i] = w.rc
		default:
			kept[w] = true
			r := replacement{old: w, rc: rc}
			if !exclusive(rc) && !exclusive(w.rc) {
				nw, err := m.newWorker(rc, w.slots)
				if err != nil {
					return fail(err)
				}
				r.next = nw
				workers = append(workers, nw)
			} else {
				// It stands for the entry until its successor is made.
				workers = append(workers, w)
			}
			replaced = append(replaced, r)
		}
	}
	// Policies are checked before any is set: a policy that does not
	// compile fails the reload before anything changed.
	for _, t := range retuned {
		if err := taskscaler.CheckPolicies(t.ps); err != nil {
			return fail(fmt.Errorf("runner %s: %w", t.w.short, err))
		}
	}
	for _, t := range retuned {
		if err := t.w.provider.(policySetter).SetPolicies(t.ps); err != nil {
			return fail(fmt.Errorf("runner %s: the new autoscaler policies: %w", t.w.short, err))
		}
		t.w.rc.Autoscaler.Policies = t.ps
		res.Retuned = append(res.Retuned, t.w.short)
	}

	// Everything is made: apply.
	m.cfg = next
	m.room.setLimit(next.Concurrent)
	m.client.SetConnectionMaxAge(next.EffectiveConnectionMaxAge())
	m.mu.Lock()
	m.setWorkers(workers)
	for _, w := range added {
		m.startWorker(w)
		res.Added = append(res.Added, w.short)
	}
	for _, r := range replaced {
		res.Replaced = append(res.Replaced, r.old.short)
		if r.next != nil {
			m.retireLocked(r.old, nil)
			m.startWorker(r.next)
		} else {
			m.retireLocked(r.old, r.rc)
		}
	}
	for _, sc := range successors {
		res.Replaced = append(res.Replaced, sc.w.short)
		sc.w.successor = sc.rc
	}
	for _, w := range current {
		if !kept[w] {
			res.Removed = append(res.Removed, w.short)
			w.successor = nil // a retired one waiting to be followed: no more
			m.retireLocked(w, nil)
		}
	}
	m.mu.Unlock()
	m.roomChanged()
	res.Changed = len(res.Added)+len(res.Removed)+len(res.Replaced)+len(res.Retuned) > 0 ||
		prev.Concurrent != next.Concurrent || prev.CheckIntervalDuration() != next.CheckIntervalDuration() ||
		prev.ShutdownTimeoutDuration() != next.ShutdownTimeoutDuration() || prev.LogLevel != next.LogLevel
	return res, nil
}

// retireLocked stops w asking for jobs; once its running jobs ended, its
// executor is shut down and, when successor is set (an exclusive entry
// restarted), a worker with those settings is made and takes w's place.
// A reload meanwhile may change or clear w.successor (m.mu). Called with
// m.mu held; nothing for a worker retired already.
func (m *Manager) retireLocked(w *worker, successor *config.Runner) {
	if w.retired.Swap(true) {
		return
	}
	w.successor = successor
	if w.retire != nil {
		w.retire()
	}
	m.retiring.Add(1)
	go func() {
		defer m.retiring.Done()
		w.loops.Wait()
		w.jobs.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), retireTimeout)
		defer cancel()
		if err := w.shutdown(ctx); err != nil {
			m.log.Warn("retired runner", "runner", w.short, "err", err)
		}
		m.log.Info("runner retired", "runner", w.short)
		m.follow(w)
	}()
}

// follow makes and starts the successor of w, a retired exclusive entry,
// in its place. It holds the configuration's lock meanwhile, as a reload
// does, so that the settings it uses are the last ones and the list of
// workers changes under one of them at a time.
func (m *Manager) follow(w *worker) {
	m.cfgMu.Lock()
	defer m.cfgMu.Unlock()
	m.mu.Lock()
	rc := w.successor
	placed := slices.Contains(m.currentWorkers(), w)
	m.mu.Unlock()
	if rc == nil || !placed {
		return
	}
	nw, err := m.newWorker(rc, w.slots)
	m.mu.Lock()
	defer m.mu.Unlock()
	ws := slices.Clone(m.currentWorkers())
	i := slices.Index(ws, w)
	if err != nil {
		// The entry is not served; a later reload makes it anew.
		m.log.Error("runner not restarted with its new settings: its executor could not be made; fix config.toml", "runner", w.short, "err", err)
		m.setWorkers(slices.Delete(ws, i, i+1))
		return
	}
	ws[i] = nw
	m.setWorkers(ws)
	m.startWorker(nw)
}

// exclusive reports whether an entry's executor holds state that a second
// executor of the same entry must not manage at the same time.
func exclusive(rc *config.Runner) bool {
	switch rc.Executor {
	case "shell", "docker", "ssh", "custom":
		return false
	}
	return true
}

func isPolicySetter(p executor.Provider) bool {
	_, ok := p.(policySetter)
	return ok
}

// policiesAlone reports whether a and b differ in their autoscaler
// policies alone.
func policiesAlone(a, b *config.Runner) bool {
	if a.Autoscaler == nil || b.Autoscaler == nil {
		return false
	}
	ac, bc := *a, *b
	aa, ba := *a.Autoscaler, *b.Autoscaler
	aa.Policies, ba.Policies = nil, nil
	ac.Autoscaler, bc.Autoscaler = &aa, &ba
	return reflect.DeepEqual(&ac, &bc) && !reflect.DeepEqual(a.Autoscaler.Policies, b.Autoscaler.Policies)
}
