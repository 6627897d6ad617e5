// Package cluster is what coordinator replicas sharing one store tell each
// other, and how they share out the work only one of them may do.
//
// A coordinator keeps per-process state beside the store: its dispatch
// queue (the pending jobs, so a long poll is answered without reading the
// store), the jobs it handed out, and its runners. The store stays the
// arbiter of every change (conditional writes); events only keep the
// other replicas' copies fresh, within milliseconds:
//
//	replica A: job enqueued ──► store ──► Publish(JobQueued)
//	                                          │ (PostgreSQL NOTIFY)
//	replica B: Events() ◄─────────────────────┘ reads the job, queues it,
//	                                            wakes its long polls
//
// Work that must run once per cluster (the reaper, expiry) runs under
// Lead; the pipeline engine's steps take EngineLock, so pipelines move on
// as if one engine ran them. Local is the cluster of one process.
package cluster

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// Kind is what an event says about its ID.
type Kind byte

// Event kinds.
const (
	// JobQueued: the job became pending and unassigned; queue it. Sent
	// by the store when the change commits, not by replicas.
	JobQueued Kind = 'q'
	// JobTaken: a queued job was handed out or left the queue; drop it.
	// Sent by the store, as JobQueued.
	JobTaken Kind = 't'
	// JobChanged: a job's state changed; forget any copy of it.
	JobChanged Kind = 'j'
	// PipelineChanged: the engine moved a pipeline on; wake its watchers.
	PipelineChanged Kind = 'p'
	// RunnerChanged: a runner was paused, edited, deleted or its token
	// reset; forget any copy of it.
	RunnerChanged Kind = 'r'
	// ProjectChanged: a project's settings (its minimum isolation)
	// changed; reload them.
	ProjectChanged Kind = 'm'
	// Resync is local: events may have been lost (the connection that
	// carries them broke); rebuild every copy from the store.
	Resync Kind = 's'
)

// Event is one change another replica made.
type Event struct {
	Kind Kind
	ID   int64
}

func (e Event) String() string { return string(e.Kind) + strconv.FormatInt(e.ID, 10) }

// Cluster connects a coordinator to the other replicas of its store.
type Cluster interface {
	// Publish sends e to the other replicas. It does not block; events
	// go out in order, batched. (JobQueued and JobTaken come from the
	// store, not from Publish.)
	Publish(e Event)
	// Events delivers the other replicas' events (never this replica's
	// own), and Resync after a gap.
	Events() <-chan Event
	// Lead runs fn whenever this replica holds the cluster's leadership
	// lease, with a context canceled when it loses it, until ctx ends.
	Lead(ctx context.Context, fn func(ctx context.Context))
	// EngineLock waits for the cluster-wide pipeline engine lock; the
	// returned function releases it.
	EngineLock(ctx context.Context) (unlock func(), err error)
	Close() error
}

// Local is the cluster of a coordinator that has its store to itself:
// nothing to tell, always the leader, the engine lock free.
type Local struct{}

// Publish implements Cluster; there is nobody to tell.
func (Local) Publish(Event) {}

// Events implements Cluster: nothing ever arrives.
func (Local) Events() <-chan Event { return nil }

// Lead runs fn at once: a single process is always the leader.
func (Local) Lead(ctx context.Context, fn func(ctx context.Context)) { fn(ctx) }

// EngineLock implements Cluster; the engine is one goroutine already.
func (Local) EngineLock(context.Context) (func(), error) { return func() {}, nil }

// Close implements Cluster.
func (Local) Close() error { return nil }

// maxPayload bounds one notification's payload (PostgreSQL's limit is
// 8,000 bytes).
const maxPayload = 7900

// encode writes events after the sender's replica ID: "ID e1 e2 …",
// splitting into payloads of at most maxPayload bytes.
func encode(replica string, events []Event) []string {
	var out []string
	var b strings.Builder
	for _, e := range events {
		s := e.String()
		if b.Len() > 0 && b.Len()+1+len(s) > maxPayload {
			out = append(out, b.String())
			b.Reset()
		}
		if b.Len() == 0 {
			b.WriteString(replica)
		}
		b.WriteByte(' ')
		b.WriteString(s)
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	return out
}

// decode parses a payload into its sender and events. It is outside
// input (anyone who may NOTIFY on the channel): a malformed event is
// skipped and reported in err, never a panic, and the events around it
// still count.
func decode(payload string) (replica string, events []Event, err error) {
	fields := strings.Fields(payload)
	if len(fields) == 0 {
		return "", nil, fmt.Errorf("empty payload")
	}
	replica = fields[0]
	var bad []string
	for _, f := range fields[1:] {
		if e, ok := decodeEvent(f); ok {
			events = append(events, e)
		} else {
			bad = append(bad, fmt.Sprintf("%.40q", f))
		}
	}
	if len(bad) > 0 {
		err = fmt.Errorf("malformed events %s", strings.Join(bad, ", "))
	}
	return replica, events, err
}

// decodeEvent parses one "kID" event.
func decodeEvent(f string) (Event, bool) {
	if len(f) < 2 {
		return Event{}, false
	}
	k := Kind(f[0])
	switch k {
	case JobQueued, JobTaken, JobChanged, PipelineChanged, RunnerChanged, ProjectChanged:
	default:
		return Event{}, false
	}
	id, err := strconv.ParseInt(f[1:], 10, 64)
	if err != nil || id <= 0 {
		return Event{}, false
	}
	return Event{Kind: k, ID: id}, true
}
