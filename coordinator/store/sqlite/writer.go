package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/berthci/berth/coordinator/store/sqlstore"
)

// ErrClosed is returned by calls made after Close.
var ErrClosed = sqlstore.ErrClosed

// The writer owns the write connection and runs write calls in batches
// (group commit, sqlstore.Batcher): BEGIN IMMEDIATE, each op in its own
// SAVEPOINT, rolled back if the op fails, so a failed op leaves nothing
// behind and its neighbours commit (measured: the savepoint costs ~1.5µs
// of ~33µs writer time per op), one COMMIT. If the transaction as a whole
// fails (COMMIT, or an error that made SQLite roll everything back, see
// txFatal), the batcher runs every op of the batch again alone.
//
//	callers ──► batcher ──► writer: BEGIN IMMEDIATE
//	                                [SAVEPOINT op; fn; RELEASE op] × n
//	                                COMMIT ──► answer n callers
type writer struct {
	conn  *sql.Conn
	stmts map[string]*sql.Stmt // prepared on conn; batcher goroutine only
	cp    *checkpointer
	b     *sqlstore.Batcher
}

func newWriter(conn *sql.Conn, maxBatch int, cp *checkpointer) *writer {
	w := &writer{conn: conn, cp: cp, stmts: make(map[string]*sql.Stmt)}
	w.b = sqlstore.NewBatcher(maxBatch, w.run, cp.nudge)
	return w
}

// do runs fn in a batch; see sqlstore.Batcher.Do.
func (w *writer) do(ctx context.Context, fn func(tx *wtx) error) error {
	return w.b.Do(ctx, func(tx sqlstore.Tx) error { return fn(tx.(*wtx)) })
}

// close lets the queued writes run and stops the writer.
func (w *writer) close() {
	w.b.Close()
	for _, st := range w.stmts {
		_ = st.Close()
	}
}

// run runs ops in one transaction and sets each op's error. It returns an
// error, and leaves no transaction open, if the transaction as a whole
// failed: then nothing of it was applied.
func (w *writer) run(ops []*sqlstore.Op) (err error) {
	tx := &wtx{w: w}
	if err := tx.control("BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.control("ROLLBACK")
		}
	}()
	for _, op := range ops {
		op.Err = nil
		if err := op.Ctx.Err(); err != nil {
			op.Err = err
			continue
		}
		if err := tx.control("SAVEPOINT op"); err != nil {
			return fmt.Errorf("opening savepoint: %w", err)
		}
		if op.Err = sqlstore.RunOp(op, tx); op.Err != nil {
			if txFatal(op.Err) {
				return fmt.Errorf("op failed the transaction: %w", op.Err)
			}
			if err := tx.control("ROLLBACK TO op"); err != nil {
				return fmt.Errorf("rolling back to savepoint: %w", err)
			}
		}
		if err := tx.control("RELEASE op"); err != nil {
			return fmt.Errorf("releasing savepoint: %w", err)
		}
	}
	if err := tx.control("COMMIT"); err != nil {
		return fmt.Errorf("committing: %w", err)
	}
	return nil
}

// txFatal reports whether an op's error may have ended the transaction.
// SQLite undoes just the failing statement for constraint and similar
// errors, but rolls back the whole transaction on some I/O, lock and
// memory errors; the statements after that would run in autocommit mode,
// each committing alone, and then be run again by the retry. So every
// SQLite error but the statement-level kinds abandons the batch.
func txFatal(err error) bool {
	if errors.Is(err, sqlstore.ErrTxAborted) {
		return true
	}
	code := sqliteCode(err)
	if code == 0 {
		return false // not from SQLite: the op's own verdict
	}
	switch code & 0xff {
	case sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_ERROR, sqlite3.SQLITE_TOOBIG,
		sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_RANGE:
		return false
	}
	return true
}

// wtx is the writer's transaction as seen by an op.
type wtx struct{ w *writer }

// stmt returns the statement for query, prepared once on the write
// connection.
func (tx *wtx) stmt(query string) (*sql.Stmt, error) {
	if st, ok := tx.w.stmts[query]; ok {
		return st, nil
	}
	st, err := tx.w.conn.PrepareContext(context.Background(), query)
	if err != nil {
		return nil, err
	}
	tx.w.stmts[query] = st
	return st, nil
}

// control runs a transaction control statement.
func (tx *wtx) control(query string) error {
	st, err := tx.stmt(query)
	if err != nil {
		return err
	}
	_, err = st.Exec()
	return err
}

// Exec runs a statement and returns the number of rows it changed.
// Statements run with a background context: the op's context was checked
// before it started, and stopping an op halfway is what the savepoint is
// for, not what a caller's deadline should do to a shared transaction.
func (tx *wtx) Exec(query string, args ...any) (int64, error) {
	st, err := tx.stmt(query)
	if err != nil {
		return 0, err
	}
	res, err := st.Exec(args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Insert runs an INSERT and returns the id of the new row. (Cheaper than
// INSERT … RETURNING id through database/sql, which builds a Rows; a
// PostgreSQL port uses RETURNING.)
func (tx *wtx) Insert(query string, args ...any) (int64, error) {
	st, err := tx.stmt(query)
	if err != nil {
		return 0, err
	}
	res, err := st.Exec(args...)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// QueryRow runs a query returning at most one row.
func (tx *wtx) QueryRow(query string, args ...any) sqlstore.Row {
	st, err := tx.stmt(query)
	if err != nil {
		// sql.Row carries no constructor for an error; run the query
		// unprepared so the error surfaces from Scan.
		return tx.w.conn.QueryRowContext(context.Background(), query, args...)
	}
	return st.QueryRow(args...)
}

// Query runs a query returning rows.
func (tx *wtx) Query(query string, args ...any) (*sql.Rows, error) {
	st, err := tx.stmt(query)
	if err != nil {
		return nil, err
	}
	return st.Query(args...)
}
