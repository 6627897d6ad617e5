// Package static is an instance group over a fixed list of existing SSH
// hosts. Increase hands free hosts out (they are running at once), Decrease
// takes them back (they stop being listed). Nothing is created or destroyed;
// the hosts must be cleaned by whoever uses them.
//
// With state_file set, which hosts are handed out survives a restart of the
// plugin; without it a restarted plugin starts with every host free.
package static

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/berthci/berth/fleeting"
)

// Host is one existing machine. Empty connection fields fall back to the
// connector settings given to Init.
type Host struct {
	// ID names the instance; default: Address.
	ID string `json:"id"`
	// Address is the internal address, "host" or "host:port". Required.
	Address string `json:"address"`
	// ExternalAddress is the external address, if different.
	ExternalAddress string `json:"external_address"`
	Username        string `json:"username"`
	Password        string `json:"password"`
	// KeyPath is a private key file, read at Init.
	KeyPath string `json:"key_path"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
}

// Config is the plugin_config of the static plugin.
type Config struct {
	// Name appears in the group ID ("static/<name>"). Default "static".
	Name string `json:"name"`
	// Hosts is the fixed list. Required, IDs unique.
	Hosts []Host `json:"hosts"`
	// StateFile, if set, records which hosts are handed out.
	StateFile string `json:"state_file"`
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if len(c.Hosts) == 0 {
		return errors.New("hosts: at least one host is required")
	}
	seen := map[string]bool{}
	for i, h := range c.Hosts {
		if h.Address == "" {
			return fmt.Errorf("hosts[%d]: address is required", i)
		}
		id := h.id()
		if seen[id] {
			return fmt.Errorf("hosts[%d]: duplicate id %q", i, id)
		}
		seen[id] = true
	}
	return nil
}

func (h Host) id() string {
	if h.ID != "" {
		return h.ID
	}
	return h.Address
}

// Group is the static instance group; its exported fields are the
// configuration.
type Group struct {
	Config

	mu       sync.Mutex
	init     bool
	settings fleeting.Settings
	logger   *slog.Logger
	keys     map[string][]byte // host id → key read from KeyPath
	inUse    []string          // handed out, in hand-out order
}

var _ fleeting.InstanceGroup = (*Group)(nil)

// New returns a static group with cfg.
func New(cfg Config) *Group { return &Group{Config: cfg} }

type state struct {
	InUse []string `json:"in_use"`
}

// Init implements fleeting.InstanceGroup.
func (g *Group) Init(ctx context.Context, logger *slog.Logger, settings fleeting.Settings) (fleeting.ProviderInfo, error) {
	if err := ctx.Err(); err != nil {
		return fleeting.ProviderInfo{}, err
	}
	if err := g.Config.Validate(); err != nil {
		return fleeting.ProviderInfo{}, fmt.Errorf("static plugin config: %w", err)
	}
	keys := map[string][]byte{}
	for _, h := range g.Hosts {
		if h.KeyPath == "" {
			continue
		}
		b, err := os.ReadFile(h.KeyPath)
		if err != nil {
			return fleeting.ProviderInfo{}, fmt.Errorf("static plugin: host %s: reading key: %w", h.id(), err)
		}
		keys[h.id()] = b
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	g.logger, g.settings, g.keys = logger, settings, keys
	if g.StateFile != "" && !g.init {
		b, err := os.ReadFile(g.StateFile)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return fleeting.ProviderInfo{}, fmt.Errorf("static plugin: reading state: %w", err)
		default:
			var st state
			if err := json.Unmarshal(b, &st); err != nil {
				return fleeting.ProviderInfo{}, fmt.Errorf("static plugin: state file %s: %w", g.StateFile, err)
			}
			for _, id := range st.InUse {
				if _, ok := g.host(id); ok && !slices.Contains(g.inUse, id) {
					g.inUse = append(g.inUse, id)
				} else if !ok {
					logger.Warn("host in state file is no longer configured; forgetting it", "instance", id)
				}
			}
		}
	}
	g.init = true
	name := g.Name
	if name == "" {
		name = "static"
	}
	return fleeting.ProviderInfo{ID: "static/" + name, MaxSize: len(g.Hosts)}, nil
}

func (g *Group) host(id string) (Host, bool) {
	for _, h := range g.Hosts {
		if h.id() == id {
			return h, true
		}
	}
	return Host{}, false
}

func (g *Group) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !g.init {
		return fleeting.ErrNotInitialized
	}
	return nil
}

// save writes the state file atomically. Called with g.mu held.
func (g *Group) save() error {
	if g.StateFile == "" {
		return nil
	}
	b, err := json.Marshal(state{InUse: g.inUse})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(g.StateFile), 0o755); err != nil {
		return err
	}
	tmp := g.StateFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, g.StateFile)
}

// Update implements fleeting.InstanceGroup: handed-out hosts are running.
func (g *Group) Update(ctx context.Context, fn func(string, fleeting.State)) error {
	g.mu.Lock()
	if err := g.check(ctx); err != nil {
		g.mu.Unlock()
		return err
	}
	ids := slices.Clone(g.inUse)
	g.mu.Unlock()
	for _, id := range ids {
		fn(id, fleeting.StateRunning)
	}
	return nil
}

// Increase implements fleeting.InstanceGroup: it hands out free hosts in
// configuration order.
func (g *Group) Increase(ctx context.Context, n int) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(ctx); err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, nil
	}
	before := len(g.inUse)
	for _, h := range g.Hosts {
		if len(g.inUse)-before == n {
			break
		}
		if !slices.Contains(g.inUse, h.id()) {
			g.inUse = append(g.inUse, h.id())
		}
	}
	got := len(g.inUse) - before
	if got == 0 {
		return 0, fmt.Errorf("static: all %d hosts are in use: %w", len(g.Hosts), fleeting.ErrQuotaExceeded)
	}
	if err := g.save(); err != nil {
		g.inUse = g.inUse[:before]
		return 0, fmt.Errorf("static: saving state: %w", err)
	}
	return got, nil
}

// Decrease implements fleeting.InstanceGroup: it takes hosts back.
func (g *Group) Decrease(ctx context.Context, ids []string) ([]string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(ctx); err != nil {
		return nil, err
	}
	prev := slices.Clone(g.inUse)
	var ok []string
	for _, id := range ids {
		if i := slices.Index(g.inUse, id); i >= 0 {
			g.inUse = slices.Delete(g.inUse, i, i+1)
			ok = append(ok, id)
		}
	}
	if len(ok) == 0 {
		return nil, nil
	}
	if err := g.save(); err != nil {
		g.inUse = prev
		return nil, fmt.Errorf("static: saving state: %w", err)
	}
	return ok, nil
}

// ConnectInfo implements fleeting.InstanceGroup. It answers for every
// configured host, handed out or not.
func (g *Group) ConnectInfo(ctx context.Context, id string) (fleeting.ConnectInfo, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(ctx); err != nil {
		return fleeting.ConnectInfo{}, err
	}
	h, ok := g.host(id)
	if !ok {
		return fleeting.ConnectInfo{}, &fleeting.InstanceError{ID: id, Err: fleeting.ErrInstanceNotFound}
	}
	cc := g.settings.ConnectorConfig
	if cc.Protocol == "" {
		cc.Protocol = fleeting.ProtocolSSH
	}
	for _, f := range []struct {
		dst *string
		v   string
	}{{&cc.Username, h.Username}, {&cc.Password, h.Password}, {&cc.OS, h.OS}, {&cc.Arch, h.Arch}} {
		if f.v != "" {
			*f.dst = f.v
		}
	}
	if k := g.keys[id]; k != nil {
		cc.Key = k
	}
	return fleeting.ConnectInfo{ConnectorConfig: cc, ID: id, InternalAddr: h.Address, ExternalAddr: h.ExternalAddress}, nil
}

// Heartbeat implements fleeting.InstanceGroup.
func (g *Group) Heartbeat(ctx context.Context, id string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(ctx); err != nil {
		return err
	}
	if _, ok := g.host(id); !ok {
		return &fleeting.InstanceError{ID: id, Err: fleeting.ErrInstanceNotFound}
	}
	return nil
}

// Shutdown implements fleeting.InstanceGroup.
func (g *Group) Shutdown(ctx context.Context) error { return ctx.Err() }
