// Package postgres is the PostgreSQL implementation of store.Store, on
// pgx: through database/sql, except for the hot writes, which a batch
// writer sends on a connection of its own through pgx's native
// interface, many statements a round trip (see rowWriter). It shares
// every statement, conversion and migration with the SQLite store
// (package sqlstore) and supplies how they run on PostgreSQL:
//
//   - A write that reads, decides and writes runs in a SERIALIZABLE
//     transaction, retried when PostgreSQL reports a serialization
//     failure or a deadlock: it behaves as if it ran alone, as every write
//     does on SQLite's single writer, whatever the number of coordinator
//     replicas writing to the database. The database is the arbiter, and
//     no caller needs a lock of its own. The hot writes of the job
//     lifecycle (create, assign, transition, touch, append to a trace)
//     are compare-and-set statements on their rows (sqlstore.RowChecked)
//     and run at READ COMMITTED: row locks decide their races, and
//     SERIALIZABLE's page-level conflict tracking would abort them
//     against their neighbours for nothing.
//   - Reads outside a transaction run at READ COMMITTED; a read that needs
//     several statements to agree (a trace's size and its chunks) runs in
//     a read-only REPEATABLE READ transaction.
//   - Migrations are the shared ones, spelled for PostgreSQL (identity
//     columns, BYTEA), each applied under a transaction-scoped advisory
//     lock so replicas starting together do not race.
//
// The schema lives in the connection's search_path (the first schema
// named there, usually public); give each Berth its own database or
// schema.
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sqlstore"
)

// ErrSchemaTooNew is returned by Open when the database was migrated by a
// newer Berth than this one (see sqlstore.ErrSchemaTooNew).
var ErrSchemaTooNew = sqlstore.ErrSchemaTooNew

// Option configures Open.
type Option func(*options)

type options struct {
	maxConns int
	retries  int
	maxBatch int
	replica  string
	now      func() time.Time
}

// WithMaxConns caps the connections the store opens (default: four times
// GOMAXPROCS, at least 8). Long polls hold none; a connection is held for
// the length of one query or transaction.
func WithMaxConns(n int) Option { return func(o *options) { o.maxConns = n } }

// WithRetries sets how many times a write transaction is retried after a
// serialization failure or deadlock before the error is returned
// (default 20).
func WithRetries(n int) Option { return func(o *options) { o.retries = n } }

// WithMaxBatch caps how many compare-and-set writes share one transaction
// (default 256; 1 turns group commit off).
func WithMaxBatch(n int) Option { return func(o *options) { o.maxBatch = n } }

// WithReplica names the coordinator replica the store writes for (its
// cluster.Postgres's Replica): the jobs trigger signs the notifications
// of this store's changes with it, so that the replica, which applied the
// change to its own copies as it made it, skips them as it skips the
// events it published itself. Without it the trigger signs "db", which
// every replica applies. The name is letters, digits, '-' and '_'.
func WithReplica(name string) Option { return func(o *options) { o.replica = name } }

// Store is a store.Store on a PostgreSQL database.
type Store struct {
	*sqlstore.Store
	db      *sql.DB
	rows    *rowWriter // group commit of RowChecked writes
	retries int
	where   string // the database, for errors: host/dbname, no password

	queries sync.Map // portable query → query with $n placeholders

	closeOnce sync.Once
	closeErr  error
}

var _ store.Store = (*Store)(nil)

// Open connects to the database named by dsn (a postgres:// URL or a
// key=value connection string, as libpq takes them; PG* environment
// variables fill what it leaves out) and migrates it to the current
// schema. It fails with ErrSchemaTooNew if the database was migrated by a
// newer binary. The caller must Close the store.
func Open(ctx context.Context, dsn string, opts ...Option) (*Store, error) {
	o := options{maxConns: max(8, 4*runtime.GOMAXPROCS(0)), retries: 20, maxBatch: 256, now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxConns < 2 || o.retries < 0 || o.maxBatch < 1 {
		return nil, errors.New("opening postgres store: max connections must be at least 2, max batch positive, retries not negative")
	}
	if !validReplica(o.replica) {
		return nil, fmt.Errorf("opening postgres store: replica name %q: want letters, digits, '-' and '_'", o.replica)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx's error repeats the connection string, password and all.
		return nil, fmt.Errorf("opening postgres store: invalid connection string: %w", redact(err, dsn))
	}
	where := fmt.Sprintf("postgres %s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
	if o.replica != "" {
		// A setting of every session, read by the jobs trigger
		// (migration 0008).
		cfg.RuntimeParams["berth.replica"] = o.replica
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(o.maxConns)
	db.SetMaxIdleConns(o.maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	s := &Store{db: db, retries: o.retries, where: where}
	if err := s.open(ctx, o); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening %s: %w", where, err)
	}
	s.rows = newRowWriter(s, cfg, o.maxBatch)
	s.Store = sqlstore.New((*backend)(s), sqlstore.PostgreSQL)
	return s, nil
}

func (s *Store) open(ctx context.Context, o options) error {
	if err := s.db.PingContext(ctx); err != nil {
		return err
	}
	ms, err := sqlstore.Migrations(sqlstore.PostgreSQL)
	if err != nil {
		return err
	}
	return sqlstore.Migrate(ctx, ms, s.exclusive, o.now)
}

// validReplica reports whether a replica name can sign a notification
// (whose fields are separated by spaces).
func validReplica(name string) bool {
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return len(name) <= 64
}

// redact removes the connection string from an error message.
func redact(err error, dsn string) error {
	if dsn == "" {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), dsn, "<connection string>"))
}

// Close closes the connections. Calls after Close fail.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.rows != nil {
			s.rows.close()
		}
		if err := s.db.Close(); err != nil {
			s.closeErr = fmt.Errorf("closing %s: %w", s.where, err)
		}
	})
	return s.closeErr
}

// DB is the store's connection pool, for what lives beside the store in
// the same database (leases, notifications). Its statements take $n
// placeholders.
func (s *Store) DB() *sql.DB { return s.db }

// exclusive runs a migration step in a transaction holding an advisory
// lock on the schema the connection works in.
func (s *Store) exclusive(ctx context.Context, fn func(sqlstore.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('berth.migrate.' || current_schema()))`); err != nil {
		return fmt.Errorf("locking the schema for migration: %w", err)
	}
	if err := fn(&pgTx{ctx: ctx, tx: tx, s: s}); err != nil {
		return err
	}
	return tx.Commit()
}

// rebind turns the portable `?` placeholders into `$1, $2, …`, leaving
// string literals, quoted identifiers and comments alone. Queries are few
// and fixed; each is rewritten once.
func (s *Store) rebind(query string) string {
	if q, ok := s.queries.Load(query); ok {
		return q.(string)
	}
	q := rebind(query)
	s.queries.Store(query, q)
	return q
}

func rebind(query string) string {
	var b strings.Builder
	b.Grow(len(query) + 16)
	n := 0
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(query) && query[j] != c {
				j++
			}
			b.WriteString(query[i:min(j+1, len(query))])
			i = j
		case c == '-' && i+1 < len(query) && query[i+1] == '-':
			j := strings.IndexByte(query[i:], '\n')
			if j < 0 {
				j = len(query) - i
			}
			b.WriteString(query[i : i+j])
			i += j - 1
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// args adapts argument values to the portable schema: booleans are
// INTEGER 0/1 columns (SQLite's driver converts them itself).
func args(in []any) []any {
	for i, a := range in {
		if _, ok := a.(bool); !ok {
			continue
		}
		out := make([]any, len(in))
		copy(out, in)
		for j := i; j < len(in); j++ {
			if b, ok := in[j].(bool); ok {
				out[j] = boolInt(b)
			}
		}
		return out
	}
	return in
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// pgCode returns the SQLSTATE of a PostgreSQL error, or "".
func pgCode(err error) string {
	var e *pgconn.PgError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// retryable reports a transaction PostgreSQL aborted so that running it
// again can succeed: a serialization failure or a deadlock.
func retryable(err error) bool {
	switch pgCode(err) {
	case "40001", "40P01":
		return true
	}
	return false
}

// backend is the Store as the shared store's sqlstore.Backend.
type backend Store

// Write runs fn in a SERIALIZABLE transaction (READ COMMITTED for a
// sqlstore.RowChecked write, whose statements are all conditional on the
// rows they change), retrying it with a short randomized backoff when
// PostgreSQL aborts it for a conflict with a concurrent one (a
// serialization failure or a deadlock). ctx bounds the wait to begin;
// once a transaction began, it runs to its end, so a nil error always
// means committed and ctx's error always means not applied.
func (b *backend) Write(ctx context.Context, iso sqlstore.Isolation, fn func(sqlstore.Tx) error) error {
	s := (*Store)(b)
	level := sql.LevelSerializable
	if iso == sqlstore.RowChecked {
		level = sql.LevelReadCommitted
	}
	backoff := 200 * time.Microsecond
	for attempt := 0; ; attempt++ {
		var err error
		if iso == sqlstore.RowChecked {
			err = s.rows.b.Do(ctx, fn)
		} else {
			err = s.writeOnce(ctx, level, fn)
		}
		if err == nil || !retryable(err) || attempt >= s.retries {
			return err
		}
		sleep := backoff/2 + rand.N(backoff)
		backoff = min(2*backoff, 50*time.Millisecond)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(sleep):
		}
	}
}

func (s *Store) writeOnce(ctx context.Context, level sql.IsolationLevel, fn func(sqlstore.Tx) error) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	run := context.WithoutCancel(ctx)
	tx, err := conn.BeginTx(run, &sql.TxOptions{Isolation: level})
	if err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			_ = tx.Rollback()
			err = fmt.Errorf("panic in store write: %v", r)
		}
	}()
	if err := fn(&pgTx{ctx: run, tx: tx, s: s}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Snapshot runs fn once in a read-only REPEATABLE READ transaction.
func (b *backend) Snapshot(ctx context.Context, fn func(sqlstore.Tx) error) error {
	s := (*Store)(b)
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	return fn(&pgTx{ctx: ctx, tx: tx, s: s})
}

// QueryRow runs a one-row read; errors surface from Scan.
func (b *backend) QueryRow(ctx context.Context, query string, a ...any) sqlstore.Row {
	s := (*Store)(b)
	return s.db.QueryRowContext(ctx, s.rebind(query), args(a)...)
}

// Query runs a read.
func (b *backend) Query(ctx context.Context, query string, a ...any) (*sql.Rows, error) {
	s := (*Store)(b)
	return s.db.QueryContext(ctx, s.rebind(query), args(a)...)
}

// IsUnique reports a unique_violation.
func (*backend) IsUnique(err error) bool { return pgCode(err) == "23505" }

// IsForeignKey reports a foreign_key_violation: the parent row is missing.
func (*backend) IsForeignKey(err error) bool { return pgCode(err) == "23503" }

// Close closes the store.
func (b *backend) Close() error { return (*Store)(b).Close() }

// pgTx is a transaction of database/sql as the shared store uses it (a
// Serializable write, a migration, a snapshot).
type pgTx struct {
	ctx context.Context
	tx  *sql.Tx
	s   *Store
}

func (t *pgTx) Exec(query string, a ...any) (int64, error) {
	res, err := t.tx.ExecContext(t.ctx, t.s.rebind(query), args(a)...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Insert runs the INSERT with RETURNING id: PostgreSQL has no last insert
// id.
func (t *pgTx) Insert(query string, a ...any) (int64, error) {
	var id int64
	err := t.tx.QueryRowContext(t.ctx, t.s.rebind(query+" RETURNING id"), args(a)...).Scan(&id)
	return id, err
}

func (t *pgTx) QueryRow(query string, a ...any) sqlstore.Row {
	return t.tx.QueryRowContext(t.ctx, t.s.rebind(query), args(a)...)
}

func (t *pgTx) Query(query string, a ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(t.ctx, t.s.rebind(query), args(a)...)
}

// isWrite reports whether a statement may change rows.
func isWrite(query string) bool {
	q := strings.TrimSpace(query)
	if len(q) < 6 {
		return false
	}
	switch strings.ToUpper(q[:6]) {
	case "INSERT", "UPDATE", "DELETE":
		return true
	}
	return false
}
