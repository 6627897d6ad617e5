// Package sqlite is the embedded, default implementation of store.Store,
// on the pure-Go SQLite driver modernc.org/sqlite.
//
// The database is one file in WAL mode. Writes go through a single writer
// connection owned by one goroutine that commits concurrent calls together
// (group commit, see writer); reads go to a pool of read-only connections
// and never wait for writes. A write call returns after its transaction
// committed; with the default synchronous=NORMAL a commit survives a crash
// of the process but the last commits may be lost on power failure (use
// WithSynchronous("FULL") to fsync every commit).
//
// The statements and the schema are package sqlstore's, shared with the
// PostgreSQL store; this package is SQLite's Backend for them. The schema's
// migrations are applied on Open and recorded in schema_migrations.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sqlstore"
)

// ErrSchemaTooNew is returned by Open when the database was migrated by a
// newer Berth than this one (see sqlstore.ErrSchemaTooNew).
var ErrSchemaTooNew = sqlstore.ErrSchemaTooNew

// Option configures Open.
type Option func(*options)

type options struct {
	readers     int
	busyTimeout time.Duration
	maxBatch    int
	synchronous string
	now         func() time.Time
}

// WithReaders sets the number of read connections (default: twice
// GOMAXPROCS, at least 4).
func WithReaders(n int) Option { return func(o *options) { o.readers = n } }

// WithBusyTimeout sets how long a connection waits for a lock held by
// another process before failing (default 5s).
func WithBusyTimeout(d time.Duration) Option { return func(o *options) { o.busyTimeout = d } }

// WithMaxBatch caps how many write calls share one transaction (default
// 512).
func WithMaxBatch(n int) Option { return func(o *options) { o.maxBatch = n } }

// WithSynchronous sets PRAGMA synchronous: "NORMAL" (default; a commit
// survives a process crash) or "FULL" or "EXTRA" (it survives power loss
// too, at the cost of an fsync per transaction), or "OFF" (no fsync at
// all, not even at checkpoints: for a database thrown away when its
// process ends, such as berth run's).
func WithSynchronous(mode string) Option { return func(o *options) { o.synchronous = mode } }

// Store is a store.Store on one SQLite file.
type Store struct {
	*sqlstore.Store
	path   string
	wdb    *sql.DB // two connections: the writer's and the checkpointer's
	w      *writer
	rdb    *sql.DB  // read-only connections
	rstmts sync.Map // query → *sql.Stmt on rdb

	closeOnce sync.Once
	closeErr  error
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database file at path and migrates
// it to the current schema. It fails with ErrSchemaTooNew if the file was
// migrated by a newer binary. The caller must Close the store.
func Open(ctx context.Context, path string, opts ...Option) (*Store, error) {
	o := options{
		readers:     max(4, 2*runtime.GOMAXPROCS(0)),
		busyTimeout: 5 * time.Second,
		maxBatch:    512,
		synchronous: "NORMAL",
		now:         time.Now,
	}
	for _, opt := range opts {
		opt(&o)
	}
	switch o.synchronous = strings.ToUpper(o.synchronous); o.synchronous {
	case "NORMAL", "FULL", "EXTRA", "OFF":
	default:
		return nil, fmt.Errorf("opening %s: synchronous %q: want NORMAL, FULL, EXTRA or OFF", path, o.synchronous)
	}
	if o.readers < 1 || o.maxBatch < 1 || o.busyTimeout < 0 {
		return nil, fmt.Errorf("opening %s: readers and max batch must be positive, busy timeout not negative", path)
	}
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") || strings.Contains(path, "?") {
		return nil, fmt.Errorf("opening %q: want a plain file path without '?' (readers and the writer share the file)", path)
	}

	s := &Store{path: path}
	if err := s.open(ctx, o); err != nil {
		s.closeDBs()
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	s.Store = sqlstore.New((*backend)(s), sqlstore.SQLite)
	return s, nil
}

// dsn builds the connection string: pragmas run on every new connection.
func dsn(path string, pragmas ...string) string {
	q := url.Values{}
	for _, p := range pragmas {
		q.Add("_pragma", p)
	}
	return path + "?" + q.Encode()
}

func (s *Store) open(ctx context.Context, o options) error {
	busy := fmt.Sprintf("busy_timeout(%d)", o.busyTimeout.Milliseconds())
	var err error
	s.wdb, err = sql.Open("sqlite", dsn(s.path,
		busy,
		"journal_mode(WAL)",
		"synchronous("+o.synchronous+")",
		"foreign_keys(1)",
		"cache_size(-32768)", // 32 MiB
		"temp_store(MEMORY)",
		"wal_autocheckpoint(0)", // see checkpointer
	))
	if err != nil {
		return err
	}
	// Two connections: the writer's and the checkpointer's.
	s.wdb.SetMaxOpenConns(2)
	s.wdb.SetMaxIdleConns(2)
	s.wdb.SetConnMaxLifetime(0)
	s.wdb.SetConnMaxIdleTime(0)
	conn, err := s.wdb.Conn(ctx)
	if err != nil {
		return err
	}
	var mode string
	if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		_ = conn.Close()
		return err
	}
	if !strings.EqualFold(mode, "wal") {
		_ = conn.Close()
		return fmt.Errorf("journal mode is %q, want wal", mode)
	}
	ms, err := sqlstore.Migrations(sqlstore.SQLite)
	if err != nil {
		_ = conn.Close()
		return err
	}
	if err := sqlstore.Migrate(ctx, ms, exclusive(conn), o.now); err != nil {
		_ = conn.Close()
		return err
	}
	cpConn, err := s.wdb.Conn(ctx)
	if err != nil {
		_ = conn.Close()
		return err
	}
	s.w = newWriter(conn, o.maxBatch, newCheckpointer(cpConn, checkpointEvery))

	s.rdb, err = sql.Open("sqlite", dsn(s.path,
		busy,
		"query_only(1)",
		"cache_size(-16384)", // 16 MiB
		"temp_store(MEMORY)",
	))
	if err != nil {
		return err
	}
	s.rdb.SetMaxOpenConns(o.readers)
	s.rdb.SetMaxIdleConns(o.readers)
	s.rdb.SetConnMaxLifetime(0)
	s.rdb.SetConnMaxIdleTime(0)
	return s.rdb.PingContext(ctx)
}

// Close waits for queued writes, then closes the database. Calls after
// Close fail with ErrClosed (or, for reads, database/sql's closed error).
func (s *Store) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.closeDBs() })
	return s.closeErr
}

func (s *Store) closeDBs() error {
	var errs []error
	if s.w != nil {
		s.w.close()
		errs = append(errs, s.w.conn.Close(), s.w.cp.close())
	}
	s.rstmts.Range(func(_, v any) bool {
		errs = append(errs, v.(*sql.Stmt).Close())
		return true
	})
	if s.rdb != nil {
		errs = append(errs, s.rdb.Close())
	}
	if s.wdb != nil {
		errs = append(errs, s.wdb.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing %s: %w", s.path, err)
	}
	return nil
}

// backend is the Store as the shared store's sqlstore.Backend.
type backend Store

// Write runs fn in the writer, in its own savepoint of a group-committed
// transaction; see writer.do. Writes are serial whatever the isolation
// asked for.
func (b *backend) Write(ctx context.Context, _ sqlstore.Isolation, fn func(sqlstore.Tx) error) error {
	return b.w.do(ctx, func(tx *wtx) error { return fn(tx) })
}

// Snapshot runs fn in a read-only transaction of the read pool.
func (b *backend) Snapshot(ctx context.Context, fn func(sqlstore.Tx) error) error {
	tx, err := b.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	return fn(&readTx{ctx: ctx, tx: tx, s: (*Store)(b)})
}

// QueryRow runs a one-row read on the read pool; errors surface from Scan.
func (b *backend) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	st, err := (*Store)(b).rstmt(ctx, query)
	if err != nil {
		return sqlstore.ErrRow{Err: err}
	}
	return st.QueryRowContext(ctx, args...)
}

// Query runs a read on the read pool.
func (b *backend) Query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := (*Store)(b).rstmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// IsUnique reports a UNIQUE or PRIMARY KEY violation.
func (*backend) IsUnique(err error) bool {
	c := sqliteCode(err)
	return c == sqlite3.SQLITE_CONSTRAINT_UNIQUE || c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}

// IsForeignKey reports a FOREIGN KEY violation: the parent row is missing.
func (*backend) IsForeignKey(err error) bool {
	return sqliteCode(err) == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}

// Close closes the store (the shared store closes its backend).
func (b *backend) Close() error { return (*Store)(b).Close() }

// rstmt returns query prepared on the read pool.
func (s *Store) rstmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st, ok := s.rstmts.Load(query); ok {
		return st.(*sql.Stmt), nil
	}
	st, err := s.rdb.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if prev, loaded := s.rstmts.LoadOrStore(query, st); loaded {
		_ = st.Close()
		return prev.(*sql.Stmt), nil
	}
	return st, nil
}

// readTx is a read-only transaction of the read pool, its statements the
// pool's prepared ones.
type readTx struct {
	ctx context.Context
	tx  *sql.Tx
	s   *Store
}

func (t *readTx) Exec(string, ...any) (int64, error) {
	return 0, errors.New("write in a read-only transaction")
}

func (t *readTx) Insert(string, ...any) (int64, error) {
	return 0, errors.New("write in a read-only transaction")
}

func (t *readTx) QueryRow(query string, args ...any) sqlstore.Row {
	st, err := t.s.rstmt(t.ctx, query)
	if err != nil {
		return sqlstore.ErrRow{Err: err}
	}
	return t.tx.StmtContext(t.ctx, st).QueryRowContext(t.ctx, args...)
}

func (t *readTx) Query(query string, args ...any) (*sql.Rows, error) {
	st, err := t.s.rstmt(t.ctx, query)
	if err != nil {
		return nil, err
	}
	return t.tx.StmtContext(t.ctx, st).QueryContext(t.ctx, args...)
}

// exclusive runs a migration step on conn in a BEGIN IMMEDIATE
// transaction: it takes the write lock before reading the version, so two
// processes opening one file do not both migrate.
func exclusive(conn *sql.Conn) sqlstore.Exclusive {
	return func(ctx context.Context, fn func(sqlstore.Tx) error) (err error) {
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			return fmt.Errorf("beginning: %w", err)
		}
		defer func() {
			if err != nil {
				_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
			}
		}()
		if err := fn(connTx{ctx, conn}); err != nil {
			return err
		}
		if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
			return fmt.Errorf("committing: %w", err)
		}
		return nil
	}
}

// connTx runs statements on a connection inside a transaction begun by
// hand.
type connTx struct {
	ctx  context.Context
	conn *sql.Conn
}

func (t connTx) Exec(query string, args ...any) (int64, error) {
	res, err := t.conn.ExecContext(t.ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (t connTx) Insert(query string, args ...any) (int64, error) {
	res, err := t.conn.ExecContext(t.ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

func (t connTx) QueryRow(query string, args ...any) sqlstore.Row {
	return t.conn.QueryRowContext(t.ctx, query, args...)
}

func (t connTx) Query(query string, args ...any) (*sql.Rows, error) {
	return t.conn.QueryContext(t.ctx, query, args...)
}

// sqliteCode returns the extended result code of a driver error, or 0.
func sqliteCode(err error) int {
	var e *msqlite.Error
	if errors.As(err, &e) {
		return e.Code()
	}
	return 0
}
