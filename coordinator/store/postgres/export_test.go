package postgres

import (
	"context"

	"github.com/berthci/berth/coordinator/store/sqlstore"
)

// What the external tests (package postgres_test, which testenv lets
// open a scratch schema) see of the batch writer.

// BatchDo runs fn as a RowChecked write through the batch writer.
func (s *Store) BatchDo(ctx context.Context, fn func(sqlstore.Tx) error) error {
	return s.rows.b.Do(ctx, fn)
}

// BatcherOf is the store's batcher, for its counters.
func BatcherOf(s *Store) *sqlstore.Batcher { return s.rows.b }

// Rebind turns a store statement's ? placeholders into $n.
func Rebind(q string) string { return rebind(q) }
