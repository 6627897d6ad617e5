// Package sqlstore is the SQL implementation of store.Store shared by the
// database engines: every statement, every conversion between Go values
// and columns, and the schema's migrations live here once. An engine
// package (sqlite, postgres) supplies a Backend: how a write transaction
// runs, how reads reach the database, how its driver reports constraint
// violations, and its dialect (placeholders and the few spellings that
// differ). An engine package embeds *Store in its own store type.
//
// The SQL is portable on purpose: `?` placeholders, standard types (see
// migrations/0001_init.sql for the rules), no engine-only functions.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/berthci/berth/coordinator/store"
)

// Backend is what a database engine provides to the shared store.
type Backend interface {
	// Write runs fn in a write transaction at (at least) isolation iso
	// and returns once it committed (nil) or did not apply at all (an
	// error). fn may run more than once (a retried transaction): it must
	// set its results afresh each time.
	Write(ctx context.Context, iso Isolation, fn func(Tx) error) error
	// Snapshot runs fn in a read-only transaction that sees one
	// consistent state of the database. fn runs once.
	Snapshot(ctx context.Context, fn func(Tx) error) error
	// QueryRow and Query run a read outside any transaction.
	QueryRow(ctx context.Context, query string, args ...any) Row
	Query(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	// IsUnique reports a UNIQUE or PRIMARY KEY violation; IsForeignKey a
	// missing parent row.
	IsUnique(err error) bool
	IsForeignKey(err error) bool
	Close() error
}

// Isolation is what a write needs from the engine when other writers run
// at the same time (SQLite has one writer: every write is serial there).
type Isolation int

const (
	// Serializable: the write reads, decides and writes (the next
	// number of a project, "insert unless present"); it must behave as
	// if no other write ran beside it.
	Serializable Isolation = iota
	// RowChecked: every statement is conditional on the rows it changes
	// (compare-and-set on a status, a size) or is a blind insert or
	// upsert, so row locks alone decide races and read committed is
	// enough. The hot writes of the job lifecycle are of this kind; at
	// Serializable their neighbours' index pages would make them fail
	// each other for nothing. A RowChecked write uses Exec, Insert and
	// QueryRow only, and scans every row it queries: an engine may batch
	// such writes and send their statements together (PostgreSQL's runs
	// a statement when its row is scanned, and has no Query).
	RowChecked
)

// Tx is a transaction as the shared store uses it. Queries carry `?`
// placeholders; the backend adapts them.
type Tx interface {
	// Exec runs a statement and returns the number of rows it changed.
	Exec(query string, args ...any) (int64, error)
	// Insert runs an INSERT of one row into a table with an id column
	// and returns the new row's id.
	Insert(query string, args ...any) (int64, error)
	QueryRow(query string, args ...any) Row
	Query(query string, args ...any) (*sql.Rows, error)
}

// Row is one result row; errors of the query surface from Scan.
type Row interface{ Scan(dest ...any) error }

// ErrRow is a Row whose Scan returns Err (a query that could not run).
type ErrRow struct{ Err error }

// Scan implements Row.
func (r ErrRow) Scan(...any) error { return r.Err }

// Store is store.Store over a Backend.
type Store struct {
	b Backend
	d Dialect
}

var _ store.Store = (*Store)(nil)

// New returns the store over b, whose SQL is spelled d. Closing the store
// closes b.
func New(b Backend, d Dialect) *Store { return &Store{b: b, d: d} }

// Close closes the backend.
func (s *Store) Close() error { return s.b.Close() }

// wtx is a write transaction as the store's methods use it.
type wtx struct{ t Tx }

func (tx *wtx) exec(query string, args ...any) (int64, error)   { return tx.t.Exec(query, args...) }
func (tx *wtx) insert(query string, args ...any) (int64, error) { return tx.t.Insert(query, args...) }
func (tx *wtx) queryRow(query string, args ...any) Row          { return tx.t.QueryRow(query, args...) }
func (tx *wtx) query(query string, args ...any) (*sql.Rows, error) {
	return tx.t.Query(query, args...)
}

// write runs fn in a Serializable write transaction; see Backend.Write.
func (s *Store) write(ctx context.Context, fn func(tx *wtx) error) error {
	return s.b.Write(ctx, Serializable, func(t Tx) error { return fn(&wtx{t}) })
}

// writeRow runs fn in a RowChecked write transaction: only for writes
// whose every statement is conditional on the rows it changes.
func (s *Store) writeRow(ctx context.Context, fn func(tx *wtx) error) error {
	return s.b.Write(ctx, RowChecked, func(t Tx) error { return fn(&wtx{t}) })
}

// queryRow runs a one-row read; errors surface from Scan.
func (s *Store) queryRow(ctx context.Context, query string, args ...any) Row {
	return s.b.QueryRow(ctx, query, args...)
}

// query runs a read.
func (s *Store) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return s.b.Query(ctx, query, args...)
}

func (s *Store) isUnique(err error) bool     { return s.b.IsUnique(err) }
func (s *Store) isForeignKey(err error) bool { return s.b.IsForeignKey(err) }

// notFound maps sql.ErrNoRows to store.ErrNotFound.
func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}
