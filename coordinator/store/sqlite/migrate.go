package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrSchemaTooNew is returned by Open when the database was migrated by a
// newer Berth than this one: its schema has versions this binary does not
// know, and writing to it could corrupt it.
var ErrSchemaTooNew = errors.New("database schema is newer than this binary")

//go:embed migrations/*.sql
var migrationFS embed.FS

// migration is one numbered schema change, migrations/NNNN_name.sql.
type migration struct {
	version int64
	name    string
	sql     string
}

// loadMigrations reads the embedded migrations in version order.
func loadMigrations(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, name := range names {
		base := path.Base(name)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_description.sql", base)
		}
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: base, sql: string(b)})
	}
	slices.SortFunc(ms, func(a, b migration) int { return int(a.version - b.version) })
	for i := range ms {
		if i > 0 && ms[i].version == ms[i-1].version {
			return nil, fmt.Errorf("migrations %s and %s share version %d", ms[i-1].name, ms[i].name, ms[i].version)
		}
	}
	return ms, nil
}

// migrate applies the migrations the database lacks, each in its own
// transaction together with its schema_migrations row, so a crash leaves
// the schema at a known version. It takes the write lock before reading
// the version, so two processes opening one file do not both migrate.
func migrate(ctx context.Context, conn *sql.Conn, ms []migration, now func() time.Time) error {
	if _, err := conn.ExecContext(ctx, sqlCreateMigrations); err != nil {
		return fmt.Errorf("creating schema_migrations: %w", err)
	}
	var latest int64
	if len(ms) > 0 {
		latest = ms[len(ms)-1].version
	}
	for _, m := range ms {
		if err := applyMigration(ctx, conn, m, latest, now); err != nil {
			return err
		}
	}
	// A database that needs nothing still has to be checked for versions
	// we do not know.
	var current int64
	if err := conn.QueryRowContext(ctx, sqlMaxMigration).Scan(&current); err != nil {
		return fmt.Errorf("reading schema version: %w", err)
	}
	if current > latest {
		return fmt.Errorf("schema version %d, this binary knows up to %d: %w", current, latest, ErrSchemaTooNew)
	}
	return nil
}

// applyMigration applies m unless already applied.
func applyMigration(ctx context.Context, conn *sql.Conn, m migration, latest int64, now func() time.Time) (err error) {
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("migration %s: beginning: %w", m.name, err)
	}
	defer func() {
		if err != nil {
			_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
		}
	}()
	var current int64
	if err := conn.QueryRowContext(ctx, sqlMaxMigration).Scan(&current); err != nil {
		return fmt.Errorf("migration %s: reading schema version: %w", m.name, err)
	}
	if current > latest {
		return fmt.Errorf("schema version %d, this binary knows up to %d: %w", current, latest, ErrSchemaTooNew)
	}
	var n int
	if err := conn.QueryRowContext(ctx, sqlHasMigration, m.version).Scan(&n); err != nil {
		return fmt.Errorf("migration %s: %w", m.name, err)
	}
	if n > 0 {
		_, err := conn.ExecContext(ctx, "COMMIT")
		return err
	}
	if _, err := conn.ExecContext(ctx, m.sql); err != nil {
		return fmt.Errorf("migration %s: %w", m.name, err)
	}
	if _, err := conn.ExecContext(ctx, sqlInsertMigration, m.version, now().UnixMicro()); err != nil {
		return fmt.Errorf("migration %s: recording: %w", m.name, err)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("migration %s: committing: %w", m.name, err)
	}
	return nil
}
