package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/berthci/berth/router"
)

// routerFlags are berth router's flags before the environment fills the
// ones not given.
type routerFlags struct {
	listen      string
	cells       []string
	defaultCell int64
	externalURL string
	cfg         router.Config // durations and counts, straight from flags
	shutdown    time.Duration
}

// config is the router's configuration: flags, else BERTH_ROUTER_*
// variables (from lookup), else defaults. changed says whether a flag was
// given.
func (f routerFlags) config(changed func(string) bool, lookup func(string) (string, bool)) (router.Config, error) {
	cfg := f.cfg
	if !changed("health-timeout") {
		cfg.HealthTimeout = 0 // the default, at most the interval
	}
	specs := f.cells
	if len(specs) == 0 {
		if v, ok := lookup("BERTH_ROUTER_CELLS"); ok {
			cells, err := router.ParseCells(v)
			if err != nil {
				return cfg, fmt.Errorf("BERTH_ROUTER_CELLS: %w", err)
			}
			cfg.Cells = cells
		}
	}
	for _, s := range specs {
		c, err := router.ParseCell(s)
		if err != nil {
			return cfg, fmt.Errorf("--cell: %w", err)
		}
		cfg.Cells = append(cfg.Cells, c)
	}
	cfg.DefaultCell = f.defaultCell
	if v, ok := lookup("BERTH_ROUTER_DEFAULT_CELL"); ok && !changed("default-cell") && v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return cfg, fmt.Errorf("BERTH_ROUTER_DEFAULT_CELL %q: want a cell id", v)
		}
		cfg.DefaultCell = n
	}
	cfg.ExternalURL = f.externalURL
	if v, ok := lookup("BERTH_ROUTER_EXTERNAL_URL"); ok && !changed("external-url") {
		cfg.ExternalURL = v
	}
	if cfg.ExternalURL == "" {
		host, port, err := net.SplitHostPort(f.listen)
		if err == nil {
			if host == "" || host == "0.0.0.0" || host == "::" {
				host = "localhost"
			}
			cfg.ExternalURL = "http://" + net.JoinHostPort(host, port)
		}
	}
	return cfg, cfg.Validate()
}

func newRouterCmd() *cobra.Command {
	var (
		f                   routerFlags
		logFormat, logLevel string
	)
	cmd := &cobra.Command{
		Use:   "router",
		Short: "Route Runner API, REST API and git requests to the cell their token belongs to (Cells)",
		Long: `Run the Cells router: a stateless HTTP proxy in front of several cells (each a berth
server, or replicas of one, with its own store). Runners, users and jobs talk to the router
as to one GitLab; it sends each request to the cell its token names (routable tokens, job
token JWTs), else to the cell X-Berth-Cell names, else to --default-cell. It keeps no state
and needs no database: run as many as you like behind a load balancer.

Cells come from --cell ID=URL (repeat it), else BERTH_ROUTER_CELLS ("1=http://…,2=http://…").
--default-cell (BERTH_ROUTER_DEFAULT_CELL) gets requests whose token names no cell; without
one they are refused with 421. Give every cell --external-url of the router's URL
(--external-url here, BERTH_ROUTER_EXTERNAL_URL): the URLs cells hand out must come back
through the router. docs/cells.md describes the routing rules.

SIGTERM or SIGINT stops accepting requests and waits --shutdown-timeout for those in flight
(held long polls answer within ~50 s).`,
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
			if v, ok := os.LookupEnv("BERTH_ROUTER_LISTEN"); ok && !cmd.Flags().Changed("listen") {
				f.listen = v
			}
			cfg, err := f.config(cmd.Flags().Changed, os.LookupEnv)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", f.listen)
			if err != nil {
				return fmt.Errorf("listening on %s: %w", f.listen, err)
			}
			return serveRouter(cmd.Context(), log, ln, cfg, f.shutdown)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address to serve on (or $BERTH_ROUTER_LISTEN)")
	fl.StringArrayVar(&f.cells, "cell", nil, "a cell, ID=URL (repeat for each cell; default: $BERTH_ROUTER_CELLS, comma-separated)")
	fl.Int64Var(&f.defaultCell, "default-cell", 0, "cell of requests whose token names no cell, and of requests without a token (default: $BERTH_ROUTER_DEFAULT_CELL; 0: refuse them with 421)")
	fl.StringVar(&f.externalURL, "external-url", "", "URL clients reach the router at, the ID tokens' issuer (default: $BERTH_ROUTER_EXTERNAL_URL, else http://LISTEN)")
	fl.DurationVar(&f.cfg.HealthInterval, "health-interval", router.Defaults.HealthInterval, "how often each cell's /-/health is checked")
	fl.DurationVar(&f.cfg.HealthTimeout, "health-timeout", router.Defaults.HealthTimeout, "time limit of one health check (default: at most the interval)")
	fl.IntVar(&f.cfg.UnhealthyAfter, "unhealthy-after", router.Defaults.UnhealthyAfter, "failed health checks in a row before a cell's requests get 503")
	fl.DurationVar(&f.cfg.DialTimeout, "dial-timeout", router.Defaults.DialTimeout, "time limit of connecting to a cell")
	fl.DurationVar(&f.shutdown, "shutdown-timeout", 60*time.Second, "how long to wait for requests in flight on shutdown (long polls are held ~50 s)")
	fl.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	fl.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd
}

// serveRouter runs a router for cfg on ln until ctx is done, then drains
// requests in flight for up to shutdown.
func serveRouter(ctx context.Context, log *slog.Logger, ln net.Listener, cfg router.Config, shutdown time.Duration) error {
	rt, err := router.New(cfg, router.Options{Logger: log})
	if err != nil {
		ln.Close()
		return err
	}
	srv := &http.Server{
		Handler: rt,
		// No read or write timeout: long polls are held ~50 s, uploads
		// and trace reads stream.
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	hctx, stopHealth := context.WithCancel(context.Background())
	defer stopHealth()
	checked := make(chan error, 1)
	go func() { checked <- rt.Run(hctx) }()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	cells := make([]string, 0, len(cfg.Cells))
	for _, c := range cfg.Cells {
		cells = append(cells, strconv.FormatInt(c.ID, 10)+"="+c.URL)
	}
	log.Info("router listening", "addr", ln.Addr().String(), "cells", strings.Join(cells, ","), "default_cell", cfg.DefaultCell, "external_url", cfg.ExternalURL)
	select {
	case err := <-served:
		stopHealth()
		<-checked
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down: waiting for requests in flight", "timeout", shutdown)
	sctx, cancel := context.WithTimeout(context.Background(), shutdown)
	defer cancel()
	err = srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		log.Warn("requests still in flight at the shutdown timeout: closing them")
		err = srv.Close()
	}
	stopHealth()
	<-checked
	if err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	log.Info("stopped")
	return nil
}
