package taskscaler

import "time"

// Clock tells the time and waits. The scaler reads time only through it, so
// tests and the simulator run it in virtual time. It satisfies the fake
// fleeting plugin's clock too.
type Clock interface {
	Now() time.Time
	// After sends the time on the channel once d has passed on this clock.
	After(d time.Duration) <-chan time.Time
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now implements Clock.
func (SystemClock) Now() time.Time { return time.Now() }

// After implements Clock.
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
