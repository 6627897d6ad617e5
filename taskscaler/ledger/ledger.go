// Package ledger is the autoscaler's crash-safe memory
// ([runners.autoscaler.state_storage]): which instances a scaler owns, how
// many jobs each has run and which slot each job holds, so a restarted
// runner manager adopts its instances instead of leaking or deleting them.
// It also holds the group lease (lease.go) that keeps two managers from
// scaling one instance group.
//
// The ledger is an append-only file of JSON lines, one event per line,
// written with fsync before the call returns: a job is never handed a slot
// the ledger does not know about. A torn last line (a crash mid-write) is
// ignored. Open replays the file and rewrites it compacted; Append
// compacts again when the file has grown well beyond the state it holds.
//
// A Ledger is not safe for concurrent use; the scaler calls it under its
// lock.
package ledger

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/berthci/berth/internal/flock"
)

// FileName is the ledger's file in its directory.
const FileName = "ledger.jsonl"

// Op is the kind of an event.
type Op string

// The events.
const (
	OpGroup     Op = "group"     // Group: the instance group the ledger is for
	OpRequested Op = "requested" // N, At: Increase accepted N instances
	OpSeen      Op = "seen"      // ID, At: an instance was first listed (consumes one requested)
	OpInstance  Op = "instance"  // ID, At: an instance known (compacted form of seen, consumes nothing)
	OpReady     Op = "ready"     // ID: ready-up succeeded
	OpAcquire   Op = "acquire"   // ID, Slot, Key: a job took a slot (and one use)
	OpRelease   Op = "release"   // ID, Slot: the job let it go
	OpUnacquire Op = "unacquire" // ID, Slot: an acquire undone before the job started (slot and use given back)
	OpRemoving  Op = "removing"  // ID: chosen for removal
	OpGone      Op = "gone"      // ID: no longer listed
)

// Event is one line of the ledger.
type Event struct {
	Op    Op        `json:"op"`
	Group string    `json:"group,omitempty"`
	ID    string    `json:"id,omitempty"`
	N     int       `json:"n,omitempty"`
	Slot  int       `json:"slot,omitempty"`
	Key   string    `json:"key,omitempty"`
	Uses  int       `json:"uses,omitempty"` // for compacted acquire events: uses beyond the current slots
	At    time.Time `json:"at,omitzero"`
}

// Instance is what the ledger knows about one instance.
type Instance struct {
	ID       string
	Seen     time.Time
	Ready    bool
	Removing bool
	Uses     int
	Slots    map[int]string // slot → key of the job holding it
}

// State is the replayed ledger.
type State struct {
	Group     string
	Instances map[string]*Instance
	order     []string
	// Requested holds the times of Increase requests not yet matched by a
	// seen instance.
	Requested []time.Time
}

// Ordered returns the instances in the order they were first seen.
func (s *State) Ordered() []*Instance {
	out := make([]*Instance, 0, len(s.order))
	for _, id := range s.order {
		if in, ok := s.Instances[id]; ok {
			out = append(out, in)
		}
	}
	return out
}

func newState() State { return State{Instances: map[string]*Instance{}} }

// apply replays one event.
func (s *State) apply(e Event) {
	in := s.Instances[e.ID]
	switch e.Op {
	case OpGroup:
		s.Group = e.Group
	case OpRequested:
		for range e.N {
			s.Requested = append(s.Requested, e.At)
		}
	case OpSeen, OpInstance:
		if in == nil {
			s.Instances[e.ID] = &Instance{ID: e.ID, Seen: e.At, Slots: map[int]string{}}
			s.order = append(s.order, e.ID)
		}
		if e.Op == OpSeen && len(s.Requested) > 0 {
			s.Requested = s.Requested[1:]
		}
	case OpReady:
		if in != nil {
			in.Ready = true
		}
	case OpAcquire:
		if in != nil {
			in.Slots[e.Slot] = e.Key
			in.Uses += 1 + e.Uses
		}
	case OpRelease:
		if in != nil {
			delete(in.Slots, e.Slot)
		}
	case OpUnacquire:
		if in != nil {
			delete(in.Slots, e.Slot)
			in.Uses = max(0, in.Uses-1)
		}
	case OpRemoving:
		if in != nil {
			in.Removing = true
		}
	case OpGone:
		if in != nil {
			delete(s.Instances, e.ID)
			s.order = slices.DeleteFunc(s.order, func(id string) bool { return id == e.ID })
		}
	}
}

// events returns a minimal event list that replays to s.
func (s *State) events() []Event {
	evs := []Event{{Op: OpGroup, Group: s.Group}}
	for _, at := range s.Requested {
		evs = append(evs, Event{Op: OpRequested, N: 1, At: at})
	}
	for _, in := range s.Ordered() {
		evs = append(evs, Event{Op: OpInstance, ID: in.ID, At: in.Seen})
		if in.Ready {
			evs = append(evs, Event{Op: OpReady, ID: in.ID})
		}
		slots := slices.Sorted(maps.Keys(in.Slots))
		extra := in.Uses - len(slots)
		for _, slot := range slots {
			evs = append(evs, Event{Op: OpAcquire, ID: in.ID, Slot: slot, Key: in.Slots[slot], Uses: extra})
			extra = 0
		}
		if extra > 0 {
			// Uses of jobs long gone: an acquire and its release.
			evs = append(evs, Event{Op: OpAcquire, ID: in.ID, Slot: -1, Uses: extra - 1}, Event{Op: OpRelease, ID: in.ID, Slot: -1})
		}
		if in.Removing {
			evs = append(evs, Event{Op: OpRemoving, ID: in.ID})
		}
	}
	return evs
}

// Ledger is an open ledger file.
type Ledger struct {
	dir   string
	lock  *os.File
	f     *os.File
	state State
	lines int
}

var (
	// ErrOtherGroup: the ledger in dir belongs to another instance group.
	ErrOtherGroup = errors.New("ledger belongs to another instance group")
	// ErrInUse: another live process has the ledger open.
	ErrInUse = errors.New("ledger in use by another process")
)

// Open opens (creating if needed) the ledger in dir for group, replays it
// and compacts it. It returns the state as left by the previous process.
// A ledger written for another group is an error wrapping ErrOtherGroup:
// the configuration changed under it, and adopting or deleting what it
// lists would act on the wrong group. The ledger is locked (flock) until
// Close: a second process opening it gets ErrInUse, and a crashed
// process's lock goes with it.
func Open(dir, group string) (l *Ledger, st State, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, State{}, fmt.Errorf("ledger: %w", err)
	}
	lock, err := lockFile(filepath.Join(dir, "ledger.lock"))
	if err != nil {
		return nil, State{}, fmt.Errorf("ledger %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	path := filepath.Join(dir, FileName)
	st = newState()
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, State{}, fmt.Errorf("ledger: %w", err)
	}
	replay(&st, data)
	if st.Group != "" && st.Group != group {
		return nil, State{}, fmt.Errorf("ledger %s: %w: %q, not %q", path, ErrOtherGroup, st.Group, group)
	}
	st.Group = group
	l = &Ledger{dir: dir, state: st, lock: lock}
	if err := l.compact(); err != nil {
		return nil, State{}, err
	}
	return l, l.snapshot(), nil
}

// replay applies every complete, well-formed line of data.
func replay(st *State, data []byte) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var e Event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // a torn line
		}
		st.apply(e)
	}
}

// snapshot returns a deep copy of the state.
func (l *Ledger) snapshot() State {
	var buf bytes.Buffer
	for _, e := range l.state.events() {
		b, _ := json.Marshal(e)
		buf.Write(b)
		buf.WriteByte('\n')
	}
	st := newState()
	replay(&st, buf.Bytes())
	return st
}

// Append records events, durably, before returning.
func (l *Ledger) Append(evs ...Event) error {
	if len(evs) == 0 {
		return nil
	}
	var buf bytes.Buffer
	for _, e := range evs {
		l.state.apply(e)
		b, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("ledger: %w", err)
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	if _, err := l.f.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	l.lines += len(evs)
	if l.lines > 1024+8*len(l.state.Instances) {
		return l.compact()
	}
	return nil
}

// compact rewrites the file with the minimal events of the state:
// temporary file, fsync, rename, fsync of the directory.
func (l *Ledger) compact() error {
	path := filepath.Join(l.dir, FileName)
	tmp, err := os.CreateTemp(l.dir, FileName+".*")
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	evs := l.state.events()
	w := bufio.NewWriter(tmp)
	for _, e := range evs {
		b, _ := json.Marshal(e)
		w.Write(b)
		w.WriteByte('\n')
	}
	err = errors.Join(w.Flush(), tmp.Sync(), tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("ledger: compacting: %w", err)
	}
	if d, err := os.Open(l.dir); err == nil {
		d.Sync()
		d.Close()
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if l.f != nil {
		l.f.Close()
	}
	l.f, l.lines = f, len(evs)
	return nil
}

// State returns a copy of the current state.
func (l *Ledger) State() State { return l.snapshot() }

// Close closes the file. The ledger stays on disk for the next Open.
func (l *Ledger) Close() error {
	if l.f == nil {
		return nil
	}
	err := errors.Join(l.f.Close(), l.lock.Close())
	l.f = nil
	return err
}

// lockFile takes the ledger's lock: ErrInUse when another process holds
// it. Where there are no file locks it only opens the file: a second
// process cannot be told.
func lockFile(path string) (*os.File, error) {
	f, err := flock.TryLock(path, 0o600)
	switch {
	case errors.Is(err, flock.ErrLocked):
		return nil, ErrInUse
	case errors.Is(err, flock.ErrUnsupported):
		return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	}
	return f, err
}

// withLock runs fn holding the lock file path (waiting for it). Without
// file locks, two managers starting in the same instant could both take
// a lease; the expiry check still stops a second manager in every other
// case.
func withLock(path string, fn func() error) error {
	f, err := flock.LockWait(path, 0o600)
	if errors.Is(err, flock.ErrUnsupported) {
		return fn()
	}
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	defer f.Close()
	return fn()
}
