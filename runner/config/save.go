package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/berthci/berth/executor/slotcgroup"
	"github.com/berthci/berth/taskscaler"
)

// Save writes c to path atomically: a temporary file in the same directory
// is written, synced and renamed over path, keeping path's mode (0600 for a
// new file). Keys Berth does not know, loaded from the file, are kept; a
// known key keeps its written form when its value did not change (so a
// url = "$GITLAB_URL" stays as written).
func Save(path string, c *Config) error {
	doc := c.raw
	if doc == nil {
		doc = map[string]any{}
	}
	doc = cloneMap(doc)
	setKey(doc, "concurrent", c.Concurrent)
	setKey(doc, "check_interval", c.CheckInterval)
	setKey(doc, "shutdown_timeout", c.ShutdownTimeout)
	setKey(doc, "listen_address", c.ListenAddress)
	setKey(doc, "log_level", c.LogLevel)
	setKey(doc, "log_format", c.LogFormat)
	var runners []map[string]any
	for _, r := range c.Runners {
		if r == nil {
			continue
		}
		m := r.raw
		if m == nil {
			m = map[string]any{}
		}
		m = cloneMap(m)
		r.merge(m)
		runners = append(runners, m)
	}
	if len(runners) > 0 {
		doc["runners"] = runners
	} else {
		delete(doc, "runners")
	}
	var buf bytes.Buffer
	buf.WriteString("# Berth runner configuration (GitLab Runner's config.toml keys).\n")
	enc := toml.NewEncoder(&buf)
	enc.Indent = "  "
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("encoding config: %w", err)
	}
	if err := WriteFileAtomic(path, buf.Bytes(), 0o600); err != nil {
		return err
	}
	// What is on disk is now the base of the next Save.
	c.raw = doc
	for i, r := range c.Runners {
		if r != nil && i < len(runners) {
			r.raw = runners[i]
		}
	}
	return nil
}

func (r *Runner) merge(m map[string]any) {
	setKey(m, "name", r.Name)
	setKey(m, "url", r.URL)
	setKey(m, "id", r.ID)
	setKey(m, "token", r.Token)
	if r.Token != "" {
		// GitLab writes both times, the zero time meaning "never expires".
		m["token_obtained_at"] = r.TokenObtainedAt.UTC()
		m["token_expires_at"] = r.TokenExpiresAt.UTC()
	}
	setKey(m, "executor", r.Executor)
	setKey(m, "limit", r.Limit)
	setKey(m, "request_concurrency", r.RequestConcurrency)
	setKey(m, "builds_dir", r.BuildsDir)
	setKey(m, "cache_dir", r.CacheDir)
	setKey(m, "shell", r.Shell)
	setPathKey(m, "tls-ca-file", r.TLSCAFile)
	setPathKey(m, "tls-cert-file", r.TLSCertFile)
	setPathKey(m, "tls-key-file", r.TLSKeyFile)
	if len(r.Environment) > 0 {
		m["environment"] = r.Environment
	} else {
		delete(m, "environment")
	}
	setKey(m, "pre_get_sources_script", r.PreGetSourcesScript)
	setKey(m, "post_get_sources_script", r.PostGetSourcesScript)
	setKey(m, "pre_build_script", r.PreBuildScript)
	setKey(m, "post_build_script", r.PostBuildScript)
	setKey(m, "output_limit", r.OutputLimit)
	if r.UseSlotCgroups {
		m["use_slot_cgroups"] = true
	} else {
		delete(m, "use_slot_cgroups")
	}
	setKey(m, "slot_cgroup_template", r.SlotCgroupTemplate)
	if len(r.FeatureFlags) > 0 {
		m["feature_flags"] = r.FeatureFlags
	} else {
		delete(m, "feature_flags")
	}
	setKey(m, "unhealthy_requests_limit", r.UnhealthyRequestsLimit)
	if r.UnhealthyInterval != 0 {
		if s, ok := m["unhealthy_interval"].(string); !ok || parseDur(s) != r.UnhealthyInterval {
			m["unhealthy_interval"] = r.UnhealthyInterval.String()
		}
	} else {
		delete(m, "unhealthy_interval")
	}
	setKey(m, "job_status_final_update_retry_limit", r.JobStatusFinalUpdateRetryLimit)
	// An executor section read from the file keeps its written form (and
	// the keys Berth does not know); one made in memory (register) is
	// written with its keys that are set.
	for key, sec := range map[string]any{"docker": r.Docker, "ssh": r.SSH, "custom": r.Custom, "plugin": r.Plugin, "microvm": r.MicroVM, "autoscaler": r.Autoscaler, "slot_cgroup": r.SlotCgroup, "cache": r.Cache} {
		if _, ok := m[key]; ok || isNilSection(sec) {
			continue
		}
		if t := sectionTable(sec); len(t) > 0 {
			m[key] = t
		}
	}
}

func isNilSection(v any) bool {
	switch s := v.(type) {
	case *Docker:
		return s == nil
	case *SSH:
		return s == nil
	case *Custom:
		return s == nil
	case *Plugin:
		return s == nil
	case *MicroVM:
		return s == nil
	case *taskscaler.Config:
		return s == nil
	case *slotcgroup.Limits:
		return s == nil
	case *Cache:
		return s == nil
	}
	return true
}

// sectionTable is a section struct as a TOML table of its keys that are
// set (no false, 0, "" or empty list).
func sectionTable(v any) map[string]any {
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(v); err != nil {
		return nil
	}
	var t map[string]any
	if _, err := toml.Decode(buf.String(), &t); err != nil {
		return nil
	}
	prune(t)
	return t
}

// prune drops the keys of t that are not set: false, 0, "", a zero
// duration ("0s"), empty lists and tables, recursively (sub-tables, and
// tables in lists of tables).
func prune(t map[string]any) {
	for k, x := range t {
		switch x := x.(type) {
		case bool:
			if !x {
				delete(t, k)
			}
		case int64:
			if x == 0 {
				delete(t, k)
			}
		case float64:
			if x == 0 {
				delete(t, k)
			}
		case string:
			if x == "" || x == "0s" {
				delete(t, k)
			}
		case []map[string]any:
			for _, e := range x {
				prune(e)
			}
			if len(x) == 0 {
				delete(t, k)
			}
		case []any:
			if len(x) == 0 {
				delete(t, k)
			}
		case map[string]any:
			prune(x)
			if len(x) == 0 {
				delete(t, k)
			}
		}
	}
}

func parseDur(s string) time.Duration {
	d, _ := time.ParseDuration(s)
	return d
}

// setKey sets a string or int key, keeping the written form when it means
// the same value and dropping the key when the value is the zero value.
// setPathKey is setKey for a path Load resolved beside config.toml: a
// relative path as written is kept while it still names v.
func setPathKey(m map[string]any, key, v string) {
	if old, ok := m[key].(string); ok && v != "" && !filepath.IsAbs(old) && filepath.IsAbs(v) &&
		strings.HasSuffix(v, string(filepath.Separator)+filepath.Clean(expandEnv(old))) {
		return
	}
	setKey(m, key, v)
}

func setKey[T string | int | int64](m map[string]any, key string, v T) {
	var zero T
	if old, ok := m[key]; ok {
		switch o := old.(type) {
		case string:
			if s, isStr := any(v).(string); isStr && expandEnv(o) == s {
				return
			}
		case int64:
			switch n := any(v).(type) {
			case int:
				if int64(n) == o {
					return
				}
			case int64:
				if n == o {
					return
				}
			}
		}
	}
	if v == zero {
		delete(m, key)
		return
	}
	m[key] = v
}

func cloneMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// WriteFileAtomic replaces path with data: temporary file in the same
// directory, fsync, rename, fsync of the directory. An existing file's mode
// is kept; a new file gets mode.
func WriteFileAtomic(path string, data []byte, mode fs.FileMode) error {
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if err := f.Chmod(mode); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
