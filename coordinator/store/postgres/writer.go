package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/berthci/berth/coordinator/store/sqlstore"
)

// rowWriter is group commit for the job lifecycle's compare-and-set writes
// (sqlstore.RowChecked): one connection of its own runs every such write
// waiting at the moment in one READ COMMITTED transaction and commits once
// (sqlstore.Batcher). On PostgreSQL a commit
// costs a WAL flush and three round trips; shared by a batch, the hot path
// (enqueue, assign, acknowledge, finish, trace) stops paying one per call.
// Writes that need SERIALIZABLE run on their own, concurrently.
//
// One connection, so batches never wait for each other's row locks (two
// batch writers could deadlock on two jobs touched in opposite orders).
type rowWriter struct {
	s    *Store
	conn *sql.Conn // batcher goroutine only
	b    *sqlstore.Batcher
}

func newRowWriter(s *Store, maxBatch int) *rowWriter {
	w := &rowWriter{s: s}
	w.b = sqlstore.NewBatcher(maxBatch, w.run, nil)
	return w
}

func (w *rowWriter) close() {
	w.b.Close()
	if w.conn != nil {
		_ = w.conn.Close()
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
func (w *rowWriter) run(ops []*sqlstore.Op) (err error) {
	ctx := context.Background()
	if w.conn == nil {
		if w.conn, err = w.s.db.Conn(ctx); err != nil {
			w.conn = nil
			return err
		}
	}
	tx, err := w.conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		_ = w.conn.Close()
		w.conn = nil
		return err
	}
	rollback := func(err error) error {
		if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			_ = w.conn.Close()
			w.conn = nil
		}
		return err
	}
	t := &pgTx{ctx: ctx, tx: tx, s: w.s}
	for _, op := range ops {
		op.Err = nil
		if err := op.Ctx.Err(); err != nil {
			op.Err = err
			continue
		}
		t.wrote, t.failed = false, false
		if op.Err = sqlstore.RunOp(op, t); op.Err == nil {
			continue
		}
		// An op that failed without changing anything (a compare-and-set
		// that matched no row, a record not found) leaves the batch
		// intact. One whose statement failed (PostgreSQL aborts the
		// transaction) or that changed rows before failing fails the
		// batch: nothing of it is applied, and the batcher runs each op
		// again alone. No savepoints: they cost two round trips an op,
		// and these writes rarely fail so.
		if len(ops) == 1 || t.failed || t.wrote || errors.Is(op.Err, sqlstore.ErrTxAborted) {
			return rollback(op.Err)
		}
	}
	if err := tx.Commit(); err != nil {
		_ = w.conn.Close()
		w.conn = nil
		for _, op := range ops {
			if op.Err == nil {
				op.Err = fmt.Errorf("committing: %w (%w)", err, errCommitUnknown)
			}
		}
	}
	return nil
}
