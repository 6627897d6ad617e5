package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/berthci/berth/coordinator/store/sqlstore"
)

// rowWriter is group commit for the job lifecycle's compare-and-set writes
// (sqlstore.RowChecked): one connection of its own runs every such write
// waiting at the moment in one READ COMMITTED transaction and commits once
// (sqlstore.Batcher). Writes that need SERIALIZABLE run on their own,
// concurrently, through database/sql.
//
// The batch travels in rounds, each one round trip: every op of the batch
// runs in a goroutine of its own until it needs a statement's result; the
// statements they wait on go to the server together in one pipeline (pgx's
// native batch), the first round's behind BEGIN; each op goes on with its
// result, and the next round carries the statements that came of that
// (the existence check after a compare-and-set that matched no row, the
// chunk after a trace's size moved). COMMIT is the last round trip. The
// hot writes are one statement each, so a batch of any size costs two
// round trips, where one statement per round trip cost n + 2.
//
//	ops ──► BEGIN; s₁ … sₙ ──► results ──► [next statements] … ──► COMMIT
//
// One connection, so batches never wait for each other's row locks (two
// batch writers could deadlock on two jobs touched in opposite orders).
type rowWriter struct {
	s    *Store
	cfg  *pgx.ConnConfig
	conn *pgx.Conn // batcher goroutine only
	b    *sqlstore.Batcher
}

func newRowWriter(s *Store, cfg *pgx.ConnConfig, maxBatch int) *rowWriter {
	w := &rowWriter{s: s, cfg: cfg}
	w.b = sqlstore.NewBatcher(maxBatch, w.run, nil)
	return w
}

func (w *rowWriter) close() {
	w.b.Close()
	w.drop()
}

// drop closes the connection (after an error that may have left it in an
// unknown state); the next batch opens another.
func (w *rowWriter) drop() {
	if w.conn != nil {
		_ = w.conn.Close(context.Background())
		w.conn = nil
	}
}

// errCommitUnknown marks ops whose batch failed at COMMIT: the connection
// may have gone after the server committed, so the change may be applied.
var errCommitUnknown = errors.New("the change may or may not have been applied")

// run applies ops in one transaction. It returns an error, having applied
// nothing, when the transaction failed before COMMIT (the batcher then
// runs each op alone); a failure at COMMIT is each op's error instead,
// since running them again could apply them twice.
func (w *rowWriter) run(ops []*sqlstore.Op) error {
	ctx := context.Background()
	if w.conn == nil || w.conn.IsClosed() {
		conn, err := pgx.ConnectConfig(ctx, w.cfg)
		if err != nil {
			w.conn = nil
			return err
		}
		w.conn = conn
	}
	began, err := w.rounds(ctx, ops)
	if err != nil {
		if began && w.conn != nil {
			if _, rerr := w.conn.Exec(ctx, "ROLLBACK"); rerr != nil {
				w.drop()
			}
		}
		return err
	}
	if !began {
		return nil // no op ran a statement
	}
	ct, err := w.conn.Exec(ctx, "COMMIT")
	if err == nil && ct.String() != "COMMIT" {
		// The server rolled back (a failed statement nobody saw): nothing
		// is applied, so the ops may run again.
		return fmt.Errorf("committing: the transaction was rolled back (%s)", ct)
	}
	if err != nil {
		w.drop()
		for _, op := range ops {
			if op.Err == nil {
				op.Err = fmt.Errorf("committing: %w (%w)", err, errCommitUnknown)
			}
		}
	}
	return nil
}

// rounds runs the ops' functions to their end, sending the statements they
// wait on round by round, and sets each op's Err. It reports whether it
// began the transaction, and returns an error if the batch cannot commit:
// a statement failed (PostgreSQL aborted the transaction) or an op failed
// after changing rows. It returns only once every op's goroutine ended.
func (w *rowWriter) rounds(ctx context.Context, ops []*sqlstore.Op) (began bool, err error) {
	parked := make(chan *batchTx, len(ops))
	live := 0
	for _, op := range ops {
		op.Err = nil
		if err := op.Ctx.Err(); err != nil {
			op.Err = err
			continue
		}
		live++
		t := &batchTx{s: w.s, parked: parked, resume: make(chan struct{})}
		go func() {
			err := sqlstore.RunOp(op, t)
			t.pending = nil
			t.finished, t.err = true, err
			parked <- t
		}()
		defer func() { op.Err = t.err }()
	}
	var (
		round   []*batchTx
		fail    error // why the batch cannot commit: an op's error
		aborted error // why the transaction cannot go on
	)
	for live > 0 {
		// Every live op is now running towards its next statement or its
		// end; wait for each.
		round = round[:0]
		for range live {
			t := <-parked
			if !t.finished {
				round = append(round, t)
				continue
			}
			live--
			if t.err != nil && fail == nil && (len(ops) == 1 || t.failed || t.wrote || errors.Is(t.err, sqlstore.ErrTxAborted)) {
				// An op that failed without changing anything (a
				// compare-and-set that matched no row, a record not
				// found) leaves the batch intact. One whose statement
				// failed or that changed rows before failing fails
				// the batch: nothing of it is applied, and the batcher
				// runs each op again alone. No savepoints: they would
				// cost a round of their own, and these writes rarely
				// fail so.
				fail = t.err
			}
		}
		if len(round) == 0 {
			break
		}
		if fail != nil || aborted != nil {
			// The batch is lost: let the others end without the
			// database.
			for _, t := range round {
				t.pending.err = fmt.Errorf("batch abandoned: %w", sqlstore.ErrTxAborted)
				t.resume <- struct{}{}
			}
			continue
		}
		b := &pgx.Batch{}
		if !began {
			b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
		}
		for _, t := range round {
			b.Queue(t.pending.query, t.pending.args...)
		}
		res := w.conn.SendBatch(ctx, b)
		if !began {
			began = true
			if _, err := res.Exec(); err != nil {
				aborted = fmt.Errorf("beginning: %w", err)
			}
		}
		for _, t := range round {
			st := t.pending
			switch {
			case aborted != nil:
				st.err = fmt.Errorf("batch abandoned: %w", sqlstore.ErrTxAborted)
			case st.dest == nil:
				ct, err := res.Exec()
				st.n, st.err = ct.RowsAffected(), err
			default:
				st.err = res.QueryRow().Scan(st.dest...)
			}
		}
		if err := res.Close(); err != nil && aborted == nil {
			// A statement failed: PostgreSQL aborted the transaction.
			// (Its op saw the error and fails the batch as it ends.)
			aborted = err
		}
		for _, t := range round {
			t.resume <- struct{}{}
		}
	}
	if fail == nil {
		fail = aborted
	}
	if fail != nil && w.conn.IsClosed() {
		w.conn = nil
	}
	return began, fail
}

// batchTx is the transaction one op of a batch sees: each statement parks
// the op's goroutine until the round that carries it has its result.
type batchTx struct {
	s       *Store
	parked  chan<- *batchTx // to the batch: a statement to run, or the end
	resume  chan struct{}   // from the batch: pending has its result
	pending *stmt

	finished bool  // the op's function returned, with err
	err      error //
	wrote    bool  // a statement of the op changed rows
	failed   bool  // a statement of the op failed: the transaction is aborted
}

// stmt is one statement of a round and its outcome.
type stmt struct {
	query string
	args  []any
	dest  []any // QueryRow's destinations; nil for Exec
	n     int64 // rows changed (Exec)
	err   error
}

// do runs one statement in the next round and returns it with its outcome.
func (t *batchTx) do(query string, a []any, dest []any) *stmt {
	st := &stmt{query: t.s.rebind(query), args: args(a), dest: scanDest(dest)}
	t.pending = st
	t.parked <- t
	<-t.resume
	return st
}

func (t *batchTx) Exec(query string, a ...any) (int64, error) {
	st := t.do(query, a, nil)
	if st.err != nil {
		t.failed = true
		return 0, st.err
	}
	if st.n > 0 {
		t.wrote = true
	}
	return st.n, nil
}

// Insert runs the INSERT with RETURNING id: PostgreSQL has no last insert
// id.
func (t *batchTx) Insert(query string, a ...any) (int64, error) {
	var id int64
	err := t.QueryRow(query+" RETURNING id", a...).Scan(&id)
	return id, err
}

// QueryRow returns the row, whose statement runs when it is scanned.
func (t *batchTx) QueryRow(query string, a ...any) sqlstore.Row {
	return &batchRow{t: t, query: query, args: a}
}

// Query is not available: a RowChecked write reads single rows only.
func (t *batchTx) Query(query string, _ ...any) (*sql.Rows, error) {
	t.failed = true
	return nil, fmt.Errorf("a batched write cannot read many rows (%.40q): %w", query, sqlstore.ErrTxAborted)
}

type batchRow struct {
	t     *batchTx
	query string
	args  []any
}

func (r *batchRow) Scan(dest ...any) error {
	if dest == nil {
		dest = []any{}
	}
	st := r.t.do(r.query, r.args, dest)
	switch {
	case st.err == nil:
		if isWrite(r.query) {
			r.t.wrote = true
		}
	case !errors.Is(st.err, sql.ErrNoRows):
		r.t.failed = true
	}
	return st.err
}

// scanDest adapts scan destinations to pgx's native scanning: the
// portable schema stores booleans as INTEGER 0/1, which database/sql
// converts and pgx does not.
func scanDest(dest []any) []any {
	for i, d := range dest {
		if _, ok := d.(*bool); !ok {
			continue
		}
		out := make([]any, len(dest))
		copy(out, dest)
		for j := i; j < len(dest); j++ {
			if b, ok := dest[j].(*bool); ok {
				out[j] = (*boolCol)(b)
			}
		}
		return out
	}
	return dest
}

// boolCol scans an INTEGER 0/1 column into a bool, as database/sql does.
type boolCol bool

func (b *boolCol) Scan(src any) error {
	var v sql.NullBool
	if err := v.Scan(src); err != nil {
		return err
	}
	if !v.Valid {
		return errors.New("converting NULL to bool is unsupported")
	}
	*b = boolCol(v.Bool)
	return nil
}
