// Package fakeclock is a clock for tests: it stands still until told to
// move. Safe for concurrent use.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a settable clock (its Now satisfies every package's Clock
// interface).
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a clock at t.
func New(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}
