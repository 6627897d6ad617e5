package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Postgres is the cluster of coordinator replicas sharing one PostgreSQL
// store (the same database and schema):
//
//   - events travel by LISTEN/NOTIFY on a channel named after the schema;
//     a listener that lost its connection reconnects and delivers Resync,
//     since notifications sent meanwhile are gone. JobQueued and JobTaken
//     are sent by the database itself (a trigger of the PostgreSQL store
//     on its jobs table), so they go out exactly when the change commits,
//     even if the replica that made it dies right after;
//   - leadership is a session advisory lock held on a connection of its
//     own: when the leader dies, PostgreSQL ends its session, the lock is
//     free, and another replica takes it within LeaseRetry;
//   - the engine lock is another session advisory lock, taken and
//     released around each engine step.
type Postgres struct {
	cfg       *pgx.ConnConfig
	log       *slog.Logger
	replica   string
	channel   string
	leadKey   int64
	engineKey int64

	events chan Event

	pmu   sync.Mutex
	queue []Event
	kick  chan struct{}

	emu   sync.Mutex
	econn *pgx.Conn

	stop      chan struct{}
	done      sync.WaitGroup
	closeOnce sync.Once
}

var _ Cluster = (*Postgres)(nil)

// LeaseRetry is how often a replica that is not the leader tries to
// become it, and how often the leader checks its lease's connection.
const LeaseRetry = time.Second

// OpenPostgres connects to the database dsn names (as the PostgreSQL
// store does) and starts listening for the other replicas' events; it
// returns once the listener is in place, so a coordinator that loads its
// state from the store afterwards misses no change made after the load.
func OpenPostgres(ctx context.Context, dsn string, log *slog.Logger) (*Postgres, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("cluster: invalid connection string")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	p := &Postgres{
		cfg: cfg, log: log, replica: hex.EncodeToString(id[:]),
		events: make(chan Event, 4096), kick: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cluster: connecting to %s:%d/%s: %w", cfg.Host, cfg.Port, cfg.Database, err)
	}
	var schema string
	err = conn.QueryRow(ctx, `SELECT current_schema(), hashtext('berth.lead.' || current_schema()),
hashtext('berth.engine.' || current_schema())`).Scan(&schema, &p.leadKey, &p.engineKey)
	if err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("cluster: %w", err)
	}
	p.channel = "berth_events_" + schema
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{p.channel}.Sanitize()); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("cluster: listening: %w", err)
	}
	p.done.Add(2)
	go p.listen(conn)
	go p.publish()
	return p, nil
}

// Replica is this replica's random ID, as its events carry it.
func (p *Postgres) Replica() string { return p.replica }

// Events implements Cluster.
func (p *Postgres) Events() <-chan Event { return p.events }

// Publish implements Cluster.
func (p *Postgres) Publish(e Event) {
	p.pmu.Lock()
	p.queue = append(p.queue, e)
	p.pmu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Close stops listening and publishing (events still queued are sent
// first) and releases leadership and the engine lock.
func (p *Postgres) Close() error {
	p.closeOnce.Do(func() {
		close(p.stop)
		p.done.Wait()
		p.emu.Lock()
		if p.econn != nil {
			p.econn.Close(context.Background())
			p.econn = nil
		}
		p.emu.Unlock()
	})
	return nil
}

// ctx is canceled when the cluster closes.
func (p *Postgres) ctx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// sleep waits d or until the cluster closes; it reports whether to go on.
func (p *Postgres) sleep(d time.Duration) bool {
	select {
	case <-p.stop:
		return false
	case <-time.After(d):
		return true
	}
}

func (p *Postgres) listen(conn *pgx.Conn) {
	defer p.done.Done()
	ctx, cancel := p.ctx()
	defer cancel()
	backoff := 100 * time.Millisecond
	for {
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				if ctx.Err() == nil {
					p.log.Warn("cluster: lost the event connection; reconnecting", "err", err)
				}
				break
			}
			replica, events, err := decode(n.Payload)
			if err != nil {
				p.log.Warn("cluster: malformed event ignored", "err", err)
			}
			if replica == p.replica {
				continue
			}
			for _, e := range events {
				if !p.deliver(e) {
					break
				}
			}
		}
		conn.Close(context.Background())
		for {
			if !p.sleep(backoff) {
				return
			}
			backoff = min(2*backoff, 5*time.Second)
			var err error
			conn, err = pgx.ConnectConfig(ctx, p.cfg)
			if err == nil {
				if _, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{p.channel}.Sanitize()); err == nil {
					break
				}
				conn.Close(context.Background())
			}
			if ctx.Err() != nil {
				return
			}
			p.log.Warn("cluster: reconnecting the event connection", "err", err)
		}
		backoff = 100 * time.Millisecond
		// Whatever was sent while the connection was down is lost.
		if !p.deliver(Event{Kind: Resync}) {
			return
		}
	}
}

// deliver hands e to the coordinator, waiting if it is behind.
func (p *Postgres) deliver(e Event) bool {
	select {
	case p.events <- e:
		return true
	case <-p.stop:
		return false
	}
}

func (p *Postgres) publish() {
	defer p.done.Done()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for {
		select {
		case <-p.kick:
		case <-p.stop:
			// Send what is queued, then stop.
			p.pmu.Lock()
			n := len(p.queue)
			p.pmu.Unlock()
			if n == 0 {
				return
			}
		}
		p.pmu.Lock()
		batch := p.queue
		p.queue = nil
		p.pmu.Unlock()
		if len(batch) == 0 {
			continue
		}
		for _, payload := range encode(p.replica, batch) {
			var err error
			for attempt := 0; attempt < 3; attempt++ {
				if conn == nil || conn.IsClosed() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					conn, err = pgx.ConnectConfig(ctx, p.cfg)
					cancel()
					if err != nil {
						conn = nil
						continue
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err = conn.Exec(ctx, "SELECT pg_notify($1, $2)", p.channel, payload)
				cancel()
				if err == nil {
					break
				}
				conn.Close(context.Background())
				conn = nil
			}
			if err != nil {
				// The others' copies may now be stale until their next
				// resync; the store still decides every change.
				p.log.Error("cluster: events not sent", "err", err)
			}
		}
	}
}

// Lead implements Cluster with a session advisory lock.
func (p *Postgres) Lead(ctx context.Context, fn func(ctx context.Context)) {
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, p.cfg)
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("cluster: connecting for the leadership lease", "err", err)
			}
			if !sleepCtx(ctx, LeaseRetry) {
				return
			}
			continue
		}
		p.leadOn(ctx, conn, fn)
		conn.Close(context.Background())
	}
}

// leadOn tries for the lease on conn until it gets it, then runs fn while
// the connection (and so the lease) lives.
func (p *Postgres) leadOn(ctx context.Context, conn *pgx.Conn, fn func(ctx context.Context)) {
	for {
		var got bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", p.leadKey).Scan(&got); err != nil {
			return
		}
		if got {
			break
		}
		if !sleepCtx(ctx, LeaseRetry) {
			return
		}
	}
	p.log.Info("cluster: this replica leads", "replica", p.replica)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		fn(lctx)
	}()
	t := time.NewTicker(LeaseRetry)
	defer t.Stop()
	for {
		select {
		case <-finished:
			return
		case <-t.C:
			pctx, pcancel := context.WithTimeout(ctx, LeaseRetry)
			err := conn.Ping(pctx)
			pcancel()
			if err != nil {
				p.log.Warn("cluster: lost the leadership lease", "err", err)
				cancel()
				<-finished
				return
			}
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// EngineLock implements Cluster with a session advisory lock on a
// connection kept for it.
func (p *Postgres) EngineLock(ctx context.Context) (func(), error) {
	p.emu.Lock()
	if p.econn == nil || p.econn.IsClosed() {
		conn, err := pgx.ConnectConfig(ctx, p.cfg)
		if err != nil {
			p.emu.Unlock()
			return nil, fmt.Errorf("cluster: engine lock: %w", err)
		}
		p.econn = conn
	}
	if _, err := p.econn.Exec(ctx, "SELECT pg_advisory_lock($1)", p.engineKey); err != nil {
		p.econn.Close(context.Background())
		p.econn = nil
		p.emu.Unlock()
		return nil, fmt.Errorf("cluster: engine lock: %w", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := p.econn.Exec(ctx, "SELECT pg_advisory_unlock($1)", p.engineKey); err != nil {
			// Closing the session releases the lock too.
			p.econn.Close(context.Background())
			p.econn = nil
		}
		p.emu.Unlock()
	}, nil
}
