package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// ErrClosed is returned by write calls made after the store closed.
var ErrClosed = errors.New("store closed")

// Batcher is group commit for an engine: write calls queue an Op and
// wait; one goroutine takes every op that is waiting (up to MaxBatch),
// hands them to the engine's run, which applies them in one transaction
// (each in a savepoint of its own, so a failed op leaves nothing behind
// and its neighbours commit) and commits once; then every caller is
// answered. A call therefore returns only after the transaction holding
// its change committed, and concurrent writes share the cost of a commit.
// If run fails as a whole (nothing of the batch applied), every op of the
// batch is run again alone, so one poisonous op cannot fail its
// neighbours.
//
//	callers ──► ops ──► run: BEGIN [SAVEPOINT; fn; RELEASE] × n COMMIT ──► answer n callers
type Batcher struct {
	ops      chan *Op
	maxBatch int
	run      func(ops []*Op) error
	after    func()

	// Batches and BatchedOps count the transactions and the ops run in
	// them.
	Batches, BatchedOps atomic.Int64

	mu     sync.RWMutex // guards closed against sends on a closed ops
	closed bool
	done   chan struct{} // closed when the goroutine has exited
}

// Op is one queued write call. run sets Err for each op it ran.
type Op struct {
	Ctx  context.Context
	Fn   func(Tx) error
	Err  error
	done chan struct{}
}

// NewBatcher starts a batcher whose batches run sees; after, if not nil,
// runs after each batch was answered (a checkpoint nudge).
func NewBatcher(maxBatch int, run func(ops []*Op) error, after func()) *Batcher {
	b := &Batcher{
		ops:      make(chan *Op, 4*maxBatch),
		maxBatch: maxBatch,
		run:      run,
		after:    after,
		done:     make(chan struct{}),
	}
	go b.loop()
	return b
}

// Do runs fn in a batch and returns its error once the transaction that
// ran it committed. If ctx ends before fn started, fn does not run and Do
// returns ctx's error; once started, Do waits for the outcome, so a nil
// error always means "committed" and ctx's error always means "not
// applied".
func (b *Batcher) Do(ctx context.Context, fn func(Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	op := &Op{Ctx: ctx, Fn: fn, done: make(chan struct{})}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return ErrClosed
	}
	select {
	case b.ops <- op:
	case <-ctx.Done():
		b.mu.RUnlock()
		return ctx.Err()
	}
	b.mu.RUnlock()
	<-op.done
	return op.Err
}

// Queued is the number of ops waiting for a batch.
func (b *Batcher) Queued() int { return len(b.ops) }

// Close stops taking ops, lets the queued ones run and waits for the
// goroutine to exit.
func (b *Batcher) Close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.ops)
	}
	b.mu.Unlock()
	<-b.done
}

func (b *Batcher) loop() {
	defer close(b.done)
	batch := make([]*Op, 0, b.maxBatch)
	for op := range b.ops {
		batch = b.fill(append(batch[:0], op))
		b.Batches.Add(1)
		b.BatchedOps.Add(int64(len(batch)))
		if err := b.run(batch); err != nil && len(batch) > 1 {
			// Retry alone: whatever failed the transaction fails only
			// its own op now.
			for _, op := range batch {
				if err := b.run([]*Op{op}); err != nil {
					op.Err = err
				}
			}
		} else if err != nil {
			batch[0].Err = err
		}
		for _, op := range batch {
			close(op.done)
		}
		clear(batch)
		if b.after != nil {
			b.after()
		}
	}
}

// fill adds waiting ops to batch. A caller's send hands the processor
// straight to the batcher (the scheduler runs a woken receiver next), so
// taking only what is queued at that instant would commit batches of one
// or two while dozens of callers are about to send. Yielding lets every
// runnable caller queue its op first; filling stops when a yield brought
// nothing new, so a lone caller pays one yield, not a wait.
func (b *Batcher) fill(batch []*Op) []*Op {
	for yielded := false; len(batch) < b.maxBatch; {
		select {
		case op, ok := <-b.ops:
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

// RunOp runs op's function on tx, turning a panic into an error wrapping
// ErrTxAborted, so that a bug in one op does not take down the batcher
// and every caller with it: the op may have stopped between its
// statements, so the batch must be abandoned.
func RunOp(op *Op, tx Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in store write: %v: %w", r, ErrTxAborted)
		}
	}()
	return op.Fn(tx)
}

// ErrTxAborted marks an op error after which the batch's transaction
// cannot be trusted: run abandons the batch (and the batcher retries its
// ops one by one).
var ErrTxAborted = errors.New("transaction aborted")
