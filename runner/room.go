package runner

import (
	"context"
	"sync"
)

// room bounds the jobs a manager runs at once (concurrent); a reload may
// change the bound while jobs hold room. Lowering it below what is held
// takes nothing back: no room is given until enough jobs ended.
type room struct {
	mu    sync.Mutex
	limit int
	used  int
	// more is closed, and replaced, whenever room may have appeared.
	more chan struct{}
}

func newRoom(limit int) *room { return &room{limit: limit, more: make(chan struct{})} }

// tryTake takes room for one job if there is some now.
func (r *room) tryTake() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.used >= r.limit {
		return false
	}
	r.used++
	return true
}

// take waits for room for one job; false if ctx ended first.
func (r *room) take(ctx context.Context) bool {
	for {
		r.mu.Lock()
		if r.used < r.limit {
			r.used++
			r.mu.Unlock()
			return true
		}
		more := r.more
		r.mu.Unlock()
		select {
		case <-more:
		case <-ctx.Done():
			return false
		}
	}
}

// give returns the room of one job.
func (r *room) give() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.used--
	r.wake()
}

// free is the room left now.
func (r *room) free() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return max(0, r.limit-r.used)
}

// setLimit changes the bound.
func (r *room) setLimit(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.limit = n
	r.wake()
}

// wake lets the waiting takers look again. Called with r.mu held.
func (r *room) wake() {
	close(r.more)
	r.more = make(chan struct{})
}
