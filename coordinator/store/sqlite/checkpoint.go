package sqlite

import (
	"context"
	"database/sql"
	"time"
)

// The writer connection does not checkpoint (wal_autocheckpoint=0): a
// checkpoint copies WAL frames into the database file and fsyncs it, and
// done inline it would stall every write call waiting on the commit.
// Instead the writer nudges a checkpointer after commits, which runs
// PASSIVE checkpoints on its own connection, in parallel with the writer
// and never waiting for readers, at most once per checkpointEvery.
const checkpointEvery = 100 * time.Millisecond

type checkpointer struct {
	conn  *sql.Conn
	kick  chan struct{}
	stop  chan struct{}
	done  chan struct{}
	every time.Duration
}

func newCheckpointer(conn *sql.Conn, every time.Duration) *checkpointer {
	c := &checkpointer{
		conn:  conn,
		kick:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		every: every,
	}
	go c.loop()
	return c
}

// nudge asks for a checkpoint soon; it never blocks.
func (c *checkpointer) nudge() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *checkpointer) loop() {
	defer close(c.done)
	for {
		select {
		case <-c.stop:
			return
		case <-c.kick:
		}
		// A failed passive checkpoint is harmless: the frames stay in the
		// WAL and the next one copies them.
		_, _ = c.conn.ExecContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)")
		select {
		case <-c.stop:
			return
		case <-time.After(c.every):
		}
	}
}

// close stops the checkpointer and runs a last, truncating checkpoint so a
// cleanly closed database is one file.
func (c *checkpointer) close() error {
	close(c.stop)
	<-c.done
	_, err := c.conn.ExecContext(context.Background(), "PRAGMA wal_checkpoint(TRUNCATE)")
	if cerr := c.conn.Close(); err == nil {
		err = cerr
	}
	return err
}
