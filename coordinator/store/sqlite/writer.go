package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/berthci/berth/coordinator/store/sqlstore"
)

// ErrClosed is returned by calls made after Close.
var ErrClosed = errors.New("sqlite store closed")

// The writer is the one goroutine that owns the write connection. Write
// calls queue an op and wait; the writer takes every op that is waiting
// (up to maxBatch), runs them in one transaction, commits once and then
// answers every caller. A call therefore returns only after the
// transaction holding its change committed, and concurrent writes share
// the cost of a commit (group commit).
//
// Ops are isolated from each other inside the batch: each runs inside its
// own SAVEPOINT, rolled back if the op fails, so a failed op leaves nothing
// behind and its neighbours commit. (Measured: the savepoint costs ~1.5µs
// of ~33µs writer time per op.) If the transaction as a whole fails
// (COMMIT, or an error that made SQLite roll everything back, see
// txFatal), every op of the batch is retried alone, so one poisonous op
// cannot fail its neighbours.
//
//	callers ──► ops channel ──► writer: BEGIN IMMEDIATE
//	                                    [SAVEPOINT op; fn; RELEASE op] × n
//	                                    COMMIT ──► answer n callers
type writer struct {
	conn     *sql.Conn
	stmts    map[string]*sql.Stmt // prepared on conn; writer goroutine only
	ops      chan *writeOp
	maxBatch int
	cp       *checkpointer

	batches, batchedOps atomic.Int64 // transactions and ops run in them

	mu     sync.RWMutex // guards closed against sends on a closed ops
	closed bool
	done   chan struct{} // closed when the writer goroutine has exited
}

// writeOp is one queued write call.
type writeOp struct {
	ctx  context.Context
	fn   func(tx *wtx) error
	err  error
	done chan struct{}
}

func newWriter(conn *sql.Conn, maxBatch int, cp *checkpointer) *writer {
	w := &writer{
		conn:     conn,
		cp:       cp,
		stmts:    make(map[string]*sql.Stmt),
		ops:      make(chan *writeOp, 4*maxBatch),
		maxBatch: maxBatch,
		done:     make(chan struct{}),
	}
	go w.loop()
	return w
}

// do runs fn in the writer and returns its error once the transaction
// that ran it committed. If ctx ends before the writer started fn, fn does
// not run and do returns ctx's error; once started, do waits for the
// outcome, so a nil error always means "committed" and ctx's error always
// means "not applied".
func (w *writer) do(ctx context.Context, fn func(tx *wtx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	op := &writeOp{ctx: ctx, fn: fn, done: make(chan struct{})}
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		return ErrClosed
	}
	select {
	case w.ops <- op:
	case <-ctx.Done():
		w.mu.RUnlock()
		return ctx.Err()
	}
	w.mu.RUnlock()
	<-op.done
	return op.err
}

// close stops taking ops, lets the writer finish the queued ones and waits
// for it to exit.
func (w *writer) close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.ops)
	}
	w.mu.Unlock()
	<-w.done
	for _, st := range w.stmts {
		_ = st.Close()
	}
}

func (w *writer) loop() {
	defer close(w.done)
	batch := make([]*writeOp, 0, w.maxBatch)
	for op := range w.ops {
		batch = w.fill(append(batch[:0], op))
		w.batches.Add(1)
		w.batchedOps.Add(int64(len(batch)))
		if err := w.run(batch); err != nil && len(batch) > 1 {
			// Retry alone: whatever failed the transaction fails only
			// its own op now.
			for _, op := range batch {
				if err := w.run([]*writeOp{op}); err != nil {
					op.err = err
				}
			}
		} else if err != nil {
			batch[0].err = err
		}
		for _, op := range batch {
			close(op.done)
		}
		clear(batch)
		w.cp.nudge()
	}
}

// fill adds waiting ops to batch. A caller's send hands the processor
// straight to the writer (the scheduler runs a woken receiver next), so
// taking only what is queued at that instant would commit batches of one
// or two while dozens of callers are about to send. Yielding lets every
// runnable caller queue its op first; filling stops when a yield brought
// nothing new, so a lone caller pays one yield, not a wait.
func (w *writer) fill(batch []*writeOp) []*writeOp {
	for yielded := false; len(batch) < w.maxBatch; {
		select {
		case op, ok := <-w.ops:
			if !ok {
				return batch
			}
			batch = append(batch, op)
			yielded = false
		default:
			if yielded {
				return batch
			}
			runtime.Gosched()
			yielded = true
		}
	}
	return batch
}

// run runs ops in one transaction and sets each op's error. It returns an
// error, and leaves no transaction open, if the transaction as a whole
// failed: then nothing of it was applied.
func (w *writer) run(ops []*writeOp) (err error) {
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
		op.err = nil
		if err := op.ctx.Err(); err != nil {
			op.err = err
			continue
		}
		if err := tx.control("SAVEPOINT op"); err != nil {
			return fmt.Errorf("opening savepoint: %w", err)
		}
		if op.err = runOp(op, tx); op.err != nil {
			if txFatal(op.err) {
				return fmt.Errorf("op failed the transaction: %w", op.err)
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

// errTxAborted marks an op error after which the batch's transaction
// cannot be trusted: the writer abandons the batch and retries its ops
// one by one.
var errTxAborted = errors.New("transaction aborted")

// txFatal reports whether an op's error may have ended the transaction.
// SQLite undoes just the failing statement for constraint and similar
// errors, but rolls back the whole transaction on some I/O, lock and
// memory errors; the statements after that would run in autocommit mode,
// each committing alone, and then be run again by the retry. So every
// SQLite error but the statement-level kinds abandons the batch.
func txFatal(err error) bool {
	if errors.Is(err, errTxAborted) {
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

// runOp runs op's function, turning a panic into an error so that a bug in
// one op does not take down the writer and every caller with it. A panic
// aborts the batch: the op may have stopped between its statements.
func runOp(op *writeOp, tx *wtx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in store write: %v: %w", r, errTxAborted)
		}
	}()
	return op.fn(tx)
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
