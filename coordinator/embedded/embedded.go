// Package embedded assembles a whole coordinator: the store (SQLite in the
// data directory, or a PostgreSQL database shared with other replicas),
// artifacts and git repositories under one data directory, optionally
// served on a listener. berth server, berth run and the dispatch benchmark
// all start their coordinator through it.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/cluster"
	"github.com/berthci/berth/coordinator/idtoken"
	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/postgres"
	"github.com/berthci/berth/coordinator/store/sealed"
	"github.com/berthci/berth/coordinator/store/sqlite"
)

// Options configure Open.
type Options struct {
	// DataDir holds berth.db, artifacts/, repos/, pages/ and oidc-keys/
	// (created if missing).
	DataDir string
	// Config configures the coordinator. RepoDir defaults to DATA/repos,
	// PagesDir to DATA/pages;
	// ExternalURL to the listener's address when Listener is set.
	Config coordinator.Config
	// Listener, if set, is served by Open until Close.
	Listener net.Listener
	// Listen, if set instead of Listener, is called once the store is
	// open and its listener served: what it waits for (finding the
	// address to listen on) overlaps with opening the store.
	Listen func() (net.Listener, error)
	Logger *slog.Logger
	// SQLite options (e.g. sqlite.WithSynchronous).
	SQLite []sqlite.Option
	// Store names the database: empty or "sqlite" for DATA/berth.db, or
	// a postgres:// URL. With PostgreSQL the coordinator is one replica
	// of those sharing the database (see docs/coordinator.md).
	Store string
	// ObjectStore, if set, is an s3:// URL where artifacts live instead
	// of DATA/artifacts (docs/object-storage.md); credentials come from
	// the environment.
	ObjectStore string
	// SecretsKeyFile holds the key that seals project variables and
	// failed jobs' VM snapshots at rest (created on first start; default
	// DATA/variables.key). Keep it apart from the database's and the
	// artifacts' backups: with both, the secrets can be read.
	SecretsKeyFile string
	// Ephemeral says the data directory goes when the coordinator stops
	// (berth run): nothing is made durable (no fsync of the database or
	// of artifacts), and the first ID token signing key is generated
	// when first needed (a token signed, the JWKS served), not at start.
	Ephemeral bool
}

// IDTokenKeyDir is where the keys that sign jobs' ID tokens live in a
// data directory (see package idtoken).
func IDTokenKeyDir(dataDir string) string { return filepath.Join(dataDir, "oidc-keys") }

// Coordinator is a started coordinator with the store it owns.
//
//	Open ──► (use Server, Store; served on Listener if given) ──► Shutdown
type Coordinator struct {
	*coordinator.Server
	Store store.Store
	// URL is the coordinator's external URL.
	URL string

	cluster cluster.Cluster

	http *http.Server
}

// Open opens the store and storage under DataDir, builds and starts the
// coordinator, and serves it on Listener when one is given. On error
// everything opened so far is closed (the listener too). The embedded
// Server's own Close only stops the coordinator; Shutdown closes it all.
func Open(ctx context.Context, o Options) (*Coordinator, error) {
	c, err := open(ctx, &o)
	if err != nil && o.Listener != nil {
		o.Listener.Close()
	}
	return c, err
}

func open(ctx context.Context, o *Options) (*Coordinator, error) {
	if o.DataDir == "" {
		return nil, errors.New("embedded coordinator: no data directory")
	}
	// Every path below is resolved once, here: git http-backend and other
	// children run in other directories, so a relative --data would name
	// another place for them.
	dataDir, err := filepath.Abs(o.DataDir)
	if err != nil {
		return nil, fmt.Errorf("data directory %q: %w", o.DataDir, err)
	}
	o.DataDir = dataDir
	// The database holds project variables and token digests, the
	// directory artifacts and repositories: nobody else may read them.
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating data directory: %w", err)
	}
	if err := os.Chmod(o.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("restricting %s: %w", o.DataDir, err)
	}
	cfg := o.Config
	if cfg.RepoDir == "" && !cfg.NoGitHosting {
		cfg.RepoDir = filepath.Join(o.DataDir, "repos")
	}
	if cfg.PagesDir == "" {
		cfg.PagesDir = filepath.Join(o.DataDir, "pages")
	}
	keyFile := o.SecretsKeyFile
	if keyFile == "" {
		keyFile = filepath.Join(o.DataDir, "variables.key")
	}
	key, err := sealed.LoadOrCreateKey(keyFile)
	if err != nil {
		return nil, err
	}
	db, cl, err := openStore(ctx, o)
	if err != nil {
		return nil, err
	}
	st := sealed.Wrap(db, key)
	closeAll := func() {
		st.Close()
		if cl != nil {
			cl.Close()
		}
	}
	if n, err := st.Migrate(ctx); err != nil {
		closeAll()
		return nil, err
	} else if n > 0 && o.Logger != nil {
		o.Logger.Info("sealed project variables stored in plain text", "count", n)
	}
	var arts artifacts.Storage
	if o.ObjectStore != "" {
		s3, err := artifacts.OpenS3(ctx, o.ObjectStore, os.Getenv)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("object store: %w", err)
		}
		arts = s3
	} else {
		dir, err := artifacts.NewDir(filepath.Join(o.DataDir, "artifacts"))
		if err != nil {
			closeAll()
			return nil, err
		}
		if o.Ephemeral {
			dir.NoSync()
		}
		arts = dir
	}
	openKeys := idtoken.Open
	if o.Ephemeral {
		openKeys = idtoken.OpenLazy
	}
	idKeys, err := openKeys(IDTokenKeyDir(o.DataDir))
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("ID token keys: %w", err)
	}
	if o.Listener == nil && o.Listen != nil {
		if o.Listener, err = o.Listen(); err != nil {
			closeAll()
			return nil, err
		}
	}
	if cfg.ExternalURL == "" && o.Listener != nil {
		cfg.ExternalURL = "http://" + o.Listener.Addr().String()
	}
	copts := coordinator.Options{Store: st, Artifacts: arts, Logger: o.Logger, IDTokenKeys: idKeys, SecretsKey: key}
	if cl != nil {
		copts.Cluster = cl
	}
	srv, err := coordinator.New(cfg, copts)
	if err != nil {
		closeAll()
		return nil, err
	}
	if err := srv.Start(ctx); err != nil {
		closeAll()
		return nil, err
	}
	c := &Coordinator{Server: srv, Store: st, URL: cfg.ExternalURL}
	if cl != nil {
		c.cluster = cl
	}
	if o.Listener != nil {
		c.http = &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 30 * time.Second}
		go c.http.Serve(o.Listener)
	}
	return c, nil
}

// Shutdown releases held long polls, stops serving (waiting up to the
// context's deadline for requests in flight), stops the coordinator and
// closes the store.
func (c *Coordinator) Shutdown(ctx context.Context) error {
	c.Server.Close() // held long polls answer 204 now
	var err error
	if c.http != nil {
		if err = c.http.Shutdown(ctx); err != nil {
			_ = c.http.Close()
		}
	}
	if c.cluster != nil {
		_ = c.cluster.Close()
	}
	if cerr := c.Store.Close(); err == nil {
		err = cerr
	}
	return err
}

// IsPostgres reports whether a --store value names a PostgreSQL database.
func IsPostgres(storeURL string) bool {
	return strings.HasPrefix(storeURL, "postgres://") || strings.HasPrefix(storeURL, "postgresql://")
}

// OpenStore opens the store a coordinator with this data directory and
// --store value uses, for tools that work on it beside the running
// coordinator (key rotation). Close it when done.
func OpenStore(ctx context.Context, dataDir, storeURL string) (store.Store, error) {
	if IsPostgres(storeURL) {
		st, err := postgres.Open(ctx, storeURL)
		if err != nil {
			return nil, fmt.Errorf("opening store: %w", err)
		}
		return st, nil
	}
	st, _, err := openStore(ctx, &Options{DataDir: dataDir, Store: storeURL})
	return st, err
}

// openStore opens the store o names and, for PostgreSQL, the cluster of
// replicas sharing it (listening before the coordinator loads its state).
func openStore(ctx context.Context, o *Options) (store.Store, *cluster.Postgres, error) {
	switch {
	case o.Store == "" || o.Store == "sqlite":
		dbPath := filepath.Join(o.DataDir, "berth.db")
		if f, err := os.OpenFile(dbPath, os.O_RDONLY|os.O_CREATE, 0o600); err != nil {
			return nil, nil, fmt.Errorf("creating %s: %w", dbPath, err)
		} else {
			f.Close()
		}
		// A data directory made by an earlier version was readable by all.
		for _, path := range []string{dbPath, dbPath + "-wal", dbPath + "-shm"} {
			if err := os.Chmod(path, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, nil, fmt.Errorf("restricting %s: %w", path, err)
			}
		}
		opts := o.SQLite
		if o.Ephemeral {
			opts = append(slices.Clone(opts), sqlite.WithSynchronous("OFF"))
		}
		db, err := sqlite.Open(ctx, dbPath, opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("opening store: %w", err)
		}
		return db, nil, nil
	case IsPostgres(o.Store):
		cl, err := cluster.OpenPostgres(ctx, o.Store, o.Logger)
		if err != nil {
			return nil, nil, fmt.Errorf("opening store: %w", err)
		}
		// The store signs the trigger's queue events with the replica's
		// name, so the replica skips its own.
		db, err := postgres.Open(ctx, o.Store, postgres.WithReplica(cl.Replica()))
		if err != nil {
			cl.Close()
			return nil, nil, fmt.Errorf("opening store: %w", err)
		}
		return db, cl, nil
	}
	return nil, nil, fmt.Errorf("store %q: want sqlite or a postgres:// URL", redactURL(o.Store))
}

// redactURL hides a password in a URL-shaped string for messages.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
	}
	return s
}
