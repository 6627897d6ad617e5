package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/coordinator"
	"github.com/berthci/berth/coordinator/embedded"
	"github.com/berthci/berth/coordinator/store/sqlite"
)

// adminTokenFile is where a generated admin token is written, in the data
// directory, for the operator (mode 0600).
const adminTokenFile = "admin-token"

func defaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "berth")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "berth")
	}
	return "berth-data"
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want json or text", format)
}

func newServerCmd() *cobra.Command {
	var (
		o                           serverOptions
		listen, logFormat, logLevel string
		synchronous                 string
		gitHosting, ui              bool
	)
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the coordinator (GitLab Runner API v4, job queue, traces, artifacts)",
		Long: `Run the coordinator. Runner managers (Berth's or the real gitlab-runner) talk to it
over GitLab's Runner API v4.

The admin token comes from --admin-token, else BERTH_ADMIN_TOKEN, else the one stored
in the data directory; on first start without one, a token is generated, written to
DATA/admin-token (mode 0600) and printed once on stderr.

The store is SQLite in the data directory by default. With --store postgres://… (or
BERTH_STORE) it is that PostgreSQL database, and several berth server processes on one
database are replicas of one coordinator: put them behind a load balancer and any of
them answers any request (docs/coordinator.md, "Replicas"). The data directory still
holds artifacts, repositories and keys.

SIGTERM or SIGINT drains held long polls (they answer 204) and exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logFormat, logLevel)
			if err != nil {
				return err
			}
			gc, err := startGCTuner()
			if err != nil {
				return err
			}
			defer gc.Stop()
			if o.AdminToken == "" {
				o.AdminToken = os.Getenv("BERTH_ADMIN_TOKEN")
			}
			if o.Config.ExternalURL == "" {
				o.Config.ExternalURL = "http://" + listen
			}
			o.SQLite = []sqlite.Option{sqlite.WithSynchronous(synchronous)}
			if o.Store == "" {
				o.Store = os.Getenv("BERTH_STORE")
			}
			o.Config.NoGitHosting = !gitHosting
			o.Config.UI.Disabled = !ui
			if !cmd.Flags().Changed("cell-id") && os.Getenv("BERTH_CELL_ID") != "" {
				id, err := strconv.ParseInt(os.Getenv("BERTH_CELL_ID"), 10, 64)
				if err != nil {
					return fmt.Errorf("BERTH_CELL_ID=%q: want a cell id (an integer)", os.Getenv("BERTH_CELL_ID"))
				}
				o.Config.CellID = id
			}
			if o.ObjectStore == "" {
				o.ObjectStore = os.Getenv("BERTH_OBJECT_STORE")
			}
			if len(o.Config.OTELEndpoints) == 0 && os.Getenv("BERTH_OTEL_ENDPOINTS") != "" {
				for _, e := range strings.Split(os.Getenv("BERTH_OTEL_ENDPOINTS"), ",") {
					if e = strings.TrimSpace(e); e != "" {
						o.Config.OTELEndpoints = append(o.Config.OTELEndpoints, e)
					}
				}
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listening on %s: %w", listen, err)
			}
			return serve(cmd.Context(), log, ln, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8080", "address to serve the API on")
	f.StringVar(&o.Data, "data", defaultDataDir(), "data directory (SQLite database, artifacts, ID token keys)")
	f.StringVar(&o.ObjectStore, "object-store", "", "s3://BUCKET/PREFIX?endpoint=HOST:PORT&region=R URL for artifacts instead of DATA/artifacts; credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (default: $BERTH_OBJECT_STORE)")
	f.StringVar(&o.Store, "store", "", "database: sqlite (DATA/berth.db) or a postgres:// URL shared by replicas (default: $BERTH_STORE, else sqlite)")
	f.StringVar(&o.AdminToken, "admin-token", "", "admin token (default: $BERTH_ADMIN_TOKEN, or stored/generated)")
	f.StringVar(&o.SecretsKeyFile, "secrets-key-file", "", "key sealing project variables at rest, created if missing (default DATA/variables.key; keep it out of the database's backups)")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&o.Config.ExternalURL, "external-url", "", "URL runners and jobs use to reach this server (default http://LISTEN)")
	f.DurationVar(&o.Config.LongPollTimeout, "long-poll-timeout", coordinator.Defaults.LongPollTimeout, "how long a jobs/request is held waiting for a job")
	f.DurationVar(&o.Config.AckTimeout, "ack-timeout", coordinator.Defaults.AckTimeout, "requeue a handed-out job not acknowledged within this time")
	f.DurationVar(&o.Config.StuckTimeout, "stuck-timeout", coordinator.Defaults.StuckTimeout, "fail a running job without updates for this long (no_updates_running)")
	f.DurationVar(&o.Config.CancelingTimeout, "canceling-timeout", coordinator.Defaults.CancelingTimeout, "cancel a canceling job without updates for this long")
	f.DurationVar(&o.Config.ReapInterval, "reap-interval", coordinator.Defaults.ReapInterval, "how often timeouts (stuck, pending, canceling) are enforced and due pipeline schedules run")
	f.DurationVar(&o.Config.TraceArchiveAfter, "archive-traces-after", coordinator.Defaults.TraceArchiveAfter, "move a finished job's log from the store to the artifact storage (--object-store or the data directory) this long after it finished (negative: never)")
	f.DurationVar(&o.Config.PendingTimeout, "pending-timeout", coordinator.Defaults.PendingTimeout, "fail a job nobody picked up for this long")
	f.DurationVar(&o.Config.RunnerTokenExpiresIn, "runner-token-expires-in", 0, "lifetime of runner authentication tokens (0: never expire)")
	f.Int64Var(&o.Config.MaxArtifactSize, "max-artifact-size", coordinator.Defaults.MaxArtifactSize, "largest artifact upload, bytes")
	f.Int64Var(&o.Config.MaxSnapshotSize, "max-snapshot-size", coordinator.Defaults.MaxSnapshotSize, "largest VM snapshot of a failed job (BERTH_SNAPSHOT), bytes")
	f.DurationVar(&o.Config.MaxSnapshotAge, "max-snapshot-age", coordinator.Defaults.MaxSnapshotAge, "longest a VM snapshot is kept, whatever its expire_in")
	f.Int64Var(&o.Config.MaxTraceSize, "max-trace-size", coordinator.Defaults.MaxTraceSize, "largest job log, bytes (past it the job fails with trace_size_exceeded)")
	f.IntVar(&o.Config.GitDepth, "git-depth", coordinator.Defaults.GitDepth, "git_info.depth of pipeline jobs (-1: full clone)")
	f.BoolVar(&ui, "ui", true, "serve the web UI at / (sign in with the admin token or a user's, docs/ui.md)")
	f.DurationVar(&o.Config.UI.SessionTTL, "ui-session-ttl", 12*time.Hour, "how long a web UI sign-in lasts")
	f.BoolVar(&gitHosting, "git-hosting", true, "host projects' git repositories (of replicas sharing a database, exactly one does: route git and project creation to it)")
	f.BoolVar(&o.Config.RegistrationDisabled, "disable-registration-tokens", false, "refuse legacy registration (POST /runners answers 410)")
	f.StringArrayVar(&o.Config.OTELEndpoints, "otel-endpoint", nil, "trace pipelines with OpenTelemetry to this OTLP endpoint (http(s):// for OTLP/HTTP, grpc(s):// for OTLP/gRPC; repeatable; default: $BERTH_OTEL_ENDPOINTS, comma-separated): the coordinator exports pipeline and job spans, runners their job_execution spans (docs/tracing.md)")
	f.Int64Var(&o.Config.CellID, "cell-id", 0, "the cell this coordinator serves (docs/cells.md): its tokens carry it, a router in front of cells routes by it (default: $BERTH_CELL_ID, else 0: no cells)")
	inc := &o.Config.Includes
	f.StringVar(&inc.TemplatesDir, "ci-templates-dir", "", "GitLab CI templates for include:template (copy lib/gitlab/ci/templates from a GitLab checkout; Berth cannot ship them)")
	f.DurationVar(&inc.RemoteTimeout, "ci-remote-timeout", 10*time.Second, "time limit of one include:remote fetch")
	f.StringSliceVar(&inc.RemoteAllowHosts, "ci-remote-allow-hosts", nil, "only these hosts (name or *.domain) may serve include:remote (default: any host not denied)")
	f.StringSliceVar(&inc.RemoteDenyHosts, "ci-remote-deny-hosts", nil, "hosts (name or *.domain) include:remote never fetches from")
	f.BoolVar(&inc.RemoteAllowHTTP, "ci-remote-allow-http", false, "allow plain http:// for include:remote (default: https only)")
	f.BoolVar(&inc.RemoteAllowPrivate, "ci-remote-allow-private-addresses", false, "allow include:remote to reach loopback, private and link-local addresses")
	f.StringVar(&inc.RemoteCAFile, "ci-remote-ca-file", "", "PEM certificate authorities trusted for include:remote, beside the system's")
	f.DurationVar(&inc.RemoteCacheTTL, "ci-remote-cache-ttl", 0, "reuse include:remote files for this long when the include does not set cache: (0: fetch every time, as GitLab)")
	f.Int64Var(&inc.RemoteCacheBytes, "ci-remote-cache-size", 32<<20, "bytes of include:remote files kept in the cache")
	f.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "how long to wait for requests in flight on shutdown")
	f.StringVar(&synchronous, "sqlite-synchronous", "NORMAL", "SQLite synchronous mode: NORMAL survives a process crash, FULL also a power loss (slower)")
	cmd.AddCommand(newOIDCKeysCmd(), newJobTokenKeysCmd())
	return cmd
}

// serverOptions are what berth server starts a coordinator with.
type serverOptions struct {
	Data, AdminToken, SecretsKeyFile string
	Store, ObjectStore               string
	Config                           coordinator.Config
	ShutdownTimeout                  time.Duration
	SQLite                           []sqlite.Option
}

// serve runs the coordinator on ln until ctx is done.
func serve(ctx context.Context, log *slog.Logger, ln net.Listener, o serverOptions) error {
	c, err := embedded.Open(ctx, embedded.Options{DataDir: o.Data, Config: o.Config, Listener: ln, Logger: log, SQLite: o.SQLite, SecretsKeyFile: o.SecretsKeyFile, Store: o.Store, ObjectStore: o.ObjectStore})
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			_ = c.Shutdown(context.Background())
		}
	}()
	minted, err := c.EnsureAdminToken(ctx, o.AdminToken)
	if err != nil {
		return fmt.Errorf("setting up the admin token: %w", err)
	}
	if minted != "" {
		p := filepath.Join(o.Data, adminTokenFile)
		if err := os.WriteFile(p, []byte(minted+"\n"), 0o600); err != nil {
			return fmt.Errorf("saving the admin token: %w", err)
		}
		fmt.Fprintf(os.Stderr, "admin token (shown once, saved to %s): %s\n", p, minted)
	}
	log.Info("coordinator listening", "addr", ln.Addr().String(), "data", o.Data)
	if !o.Config.UI.Disabled {
		log.Info("web UI", "url", c.URL+"/", "sign_in", "the admin token, or a user's (berth users create)")
	}
	<-ctx.Done()
	log.Info("shutting down: draining long polls")
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
	defer cancel()
	closed = true
	if err := c.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutting down: %w", err)
	}
	log.Info("stopped")
	return nil
}
