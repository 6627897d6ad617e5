package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/berthci/berth/internal/pgurl"
)

// PostgresEnv names the database tests of the PostgreSQL store use: a
// postgres:// URL of a database the user may create schemas in (.ci/run
// starts a cluster and sets it).
const PostgresEnv = "BERTH_TEST_POSTGRES"

// Postgres returns a connection URL of a fresh, empty schema in the test
// database (its search_path names only that schema), dropped when the
// test ends; it skips/fails the test when BERTH_TEST_POSTGRES is not set
// or the database cannot be reached. Tests running in parallel each get
// their own schema.
func Postgres(t testing.TB) string {
	t.Helper()
	base := os.Getenv(PostgresEnv)
	if base == "" {
		Missing(t, "%s is not set (a postgres:// URL of a database to create test schemas in)", PostgresEnv)
		return ""
	}
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		t.Fatalf("%s: %v", PostgresEnv, err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		Missing(t, "PostgreSQL at %s:%d unreachable: %v", cfg.Host, cfg.Port, err)
		return ""
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + strings.ToLower(hex.EncodeToString(b[:]))
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("creating test schema: %v", err)
	}
	t.Cleanup(func() { dropSchema(t, base, schema) })
	dsn, err := pgurl.InSchema(base, schema)
	if err != nil {
		t.Fatalf("%s: %v", PostgresEnv, err)
	}
	return dsn
}

func dropSchema(t testing.TB, base, schema string) {
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		return
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
		t.Logf("dropping test schema %s: %v", schema, err)
	}
}
