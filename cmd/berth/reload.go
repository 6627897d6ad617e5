package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/berthci/berth/runner"
	"github.com/berthci/berth/runner/config"
)

// configCheckInterval is how often berth runner run looks at config.toml
// (gitlab-runner's 3 s).
const configCheckInterval = 3 * time.Second

// configWatch is what watchConfig reloads.
type configWatch struct {
	path string
	// listen is --listen-address, which overrides the file's.
	listen string
	// level is the logger's, set from log_level.
	level *slog.LevelVar
	every time.Duration
	// loaded is the file's content the configuration in force came from
	// (a change made before the watch starts is a change too).
	loaded []byte
}

// watchConfig reloads the runner manager's config.toml when it changes
// (looked at every cw.every) and on SIGHUP, until ctx ends. A file that
// does not load is logged with what is wrong and where, and the
// configuration in force stays.
func watchConfig(ctx context.Context, m *runner.Manager, cw configWatch, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	last := cw.loaded
	t := time.NewTicker(cw.every)
	defer t.Stop()
	for {
		forced := false
		select {
		case <-ctx.Done():
			return
		case <-hup:
			forced = true
		case <-t.C:
		}
		data, err := os.ReadFile(cw.path)
		if err != nil {
			log.Error("config.toml not reloaded", "file", cw.path, "err", err)
			continue
		}
		if !forced && bytes.Equal(data, last) {
			continue
		}
		last = data
		reloadConfig(m, cw, log)
	}
}

func reloadConfig(m *runner.Manager, cw configWatch, log *slog.Logger) {
	var loaded *config.Config
	res, err := m.Reload(func() (*config.Config, error) {
		cfg, warns, err := config.Load(cw.path)
		if err != nil {
			return nil, err
		}
		for _, w := range warns {
			log.Warn("config key ignored", "file", w.File, "line", w.Line, "key", w.Key, "reason", w.Msg)
		}
		if cw.listen != "" {
			cfg.ListenAddress = cw.listen
		}
		loaded = cfg
		return cfg, nil
	})
	if err != nil {
		log.Error("config.toml not reloaded: the configuration in force stays", "file", cw.path, "err", err)
		return
	}
	if cw.level != nil {
		cw.level.Set(logLevel(loaded.LogLevel))
	}
	for _, key := range res.Restart {
		log.Warn("config key changed: it applies at the next start", "file", cw.path, "key", key)
	}
	if !res.Changed {
		log.Debug("config.toml reloaded: nothing changed", "file", cw.path)
		return
	}
	log.Info("config.toml reloaded", "file", cw.path, "concurrent", res.Concurrent, "added", res.Added, "removed", res.Removed,
		"restarted", res.Replaced, "policies_changed", res.Retuned)
}
