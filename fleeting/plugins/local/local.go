// Package local is an instance group whose instances are real SSH endpoints
// on this machine: each instance is a process of Berth's own SSH server
// (fleeting/internal/sshserver) running commands in a shell, on its own
// loopback address (127.77.0.n by default) — or, with root and netns set,
// inside its own network namespace with its own IP behind a veth pair. It
// is what Berth's embedded default and demos use, and what tests use to get
// real machines cheaply.
//
// Instances are created and deleted for real and outlive the plugin: the
// state lives in files under state_dir (one directory per instance, holding
// its host key, server configuration, address, log and a home directory),
// so a restarted plugin finds its instances again, and a server process
// that died (the machine rebooted) is started again on the next Update, on
// the same address.
package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/internal/flock"
	"github.com/berthci/berth/internal/reap"
)

// InstanceMarkVariable marks every process of an instance (its value is
// the instance's directory), so that deleting the instance kills them all.
const InstanceMarkVariable = "BERTH_LOCAL_INSTANCE"

// Config is the plugin_config of the local plugin.
type Config struct {
	// StateDir holds the group's state. Default
	// ~/.local/state/berth/fleeting-local/<name>. One plugin process per
	// directory (it is locked).
	StateDir string `json:"state_dir"`
	// Name appears in the group ID ("local/<name>") and prefixes instance
	// IDs. Default "local".
	Name string `json:"name"`
	// MaxInstances is the group's size. Default 10.
	MaxInstances int `json:"max_instances"`
	// AddressRange is the loopback range instance n gets its address from
	// (the n-th address). Default 127.77.0.0/16.
	AddressRange string `json:"address_range"`
	// Port is the SSH port. Default: any free port on loopback, 22 in a
	// network namespace.
	Port int `json:"port"`
	// NetNS puts each instance in its own network namespace (needs root
	// and iproute2's ip). Instance n gets the n-th /30 of NetNSRange: the
	// host side of the veth pair the first address, the instance the
	// second.
	NetNS      bool   `json:"netns"`
	NetNSRange string `json:"netns_range"`
	// Shell runs commands; default /bin/sh.
	Shell string `json:"shell"`

	// ServerArgv is the command that runs an instance server, the instance
	// directory appended. Default: this executable with the
	// "instance-server" subcommand. Not configurable from plugin_config.
	ServerArgv []string `json:"-"`
}

func (c *Config) setDefaults() error {
	if c.Name == "" {
		c.Name = "local"
	}
	if c.StateDir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return fmt.Errorf("state_dir: no default without a home directory: %w", err)
		}
		c.StateDir = filepath.Join(home, ".local", "state", "berth", "fleeting-local", c.Name)
	}
	if c.MaxInstances == 0 {
		c.MaxInstances = 10
	}
	if c.AddressRange == "" {
		c.AddressRange = "127.77.0.0/16"
	}
	if c.NetNSRange == "" {
		c.NetNSRange = "10.213.0.0/16"
	}
	if c.Shell == "" {
		c.Shell = "/bin/sh"
	}
	if len(c.ServerArgv) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		c.ServerArgv = []string{exe, ServerCommand}
	}
	return nil
}

// Validate checks the configuration (after defaults).
func (c Config) Validate() error {
	var errs []error
	if strings.ContainsAny(c.Name, "/ \t\n") {
		errs = append(errs, fmt.Errorf("name %q: no slashes or spaces", c.Name))
	}
	if c.MaxInstances < 0 {
		errs = append(errs, errors.New("max_instances: negative"))
	}
	if c.Port < 0 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("port %d out of range", c.Port))
	}
	if p, err := netip.ParsePrefix(c.AddressRange); err != nil || !p.Addr().Is4() || !p.Addr().IsLoopback() {
		errs = append(errs, fmt.Errorf("address_range %q: want an IPv4 loopback prefix such as 127.77.0.0/16", c.AddressRange))
	} else if c.MaxInstances >= 1<<(32-p.Bits())-1 {
		errs = append(errs, fmt.Errorf("address_range %s too small for %d instances", c.AddressRange, c.MaxInstances))
	}
	if c.NetNS {
		if p, err := netip.ParsePrefix(c.NetNSRange); err != nil || !p.Addr().Is4() {
			errs = append(errs, fmt.Errorf("netns_range %q: want an IPv4 prefix such as 10.213.0.0/16", c.NetNSRange))
		} else if (c.MaxInstances+1)*4 > 1<<(32-p.Bits()) {
			errs = append(errs, fmt.Errorf("netns_range %s too small for %d instances", c.NetNSRange, c.MaxInstances))
		}
	}
	return errors.Join(errs...)
}

// Group is the local instance group; its exported fields are the
// configuration.
type Group struct {
	Config

	mu       sync.Mutex
	init     bool
	lock     *os.File
	logger   *slog.Logger
	settings fleeting.Settings
	username string
	keyPEM   []byte // the plugin's generated client key
	authKeys []string
}

var _ fleeting.InstanceGroup = (*Group)(nil)

// New returns a local group with cfg.
func New(cfg Config) *Group { return &Group{Config: cfg} }

// instance is the persistent record of one instance (instance.json).
type instance struct {
	ID       string    `json:"id"`
	N        int       `json:"n"`
	Created  time.Time `json:"created"`
	PID      int       `json:"pid"`
	IP       string    `json:"ip"`
	HostIP   string    `json:"host_ip,omitempty"` // host side of the veth pair
	Port     int       `json:"port"`              // requested; 0 = any
	NetNS    string    `json:"netns,omitempty"`
	Deleting time.Time `json:"deleting,omitzero"` // when Decrease asked

	dir string
}

type groupState struct {
	Next int `json:"next"`
}

// Init implements fleeting.InstanceGroup.
func (g *Group) Init(ctx context.Context, logger *slog.Logger, settings fleeting.Settings) (fleeting.ProviderInfo, error) {
	if err := ctx.Err(); err != nil {
		return fleeting.ProviderInfo{}, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.init {
		return fleeting.ProviderInfo{}, errors.New("local plugin: already initialized")
	}
	if err := g.Config.setDefaults(); err != nil {
		return fleeting.ProviderInfo{}, fmt.Errorf("local plugin config: %w", err)
	}
	if err := g.Config.Validate(); err != nil {
		return fleeting.ProviderInfo{}, fmt.Errorf("local plugin config: %w", err)
	}
	if g.NetNS {
		if os.Geteuid() != 0 {
			return fleeting.ProviderInfo{}, errors.New("local plugin: netns needs root")
		}
		if _, err := exec.LookPath("ip"); err != nil {
			return fleeting.ProviderInfo{}, errors.New("local plugin: netns needs iproute2's ip in PATH")
		}
	}
	if err := os.MkdirAll(filepath.Join(g.StateDir, "instances"), 0o700); err != nil {
		return fleeting.ProviderInfo{}, fmt.Errorf("local plugin: state dir: %w", err)
	}
	lock, err := flock.TryLock(filepath.Join(g.StateDir, "lock"), 0o600)
	if errors.Is(err, flock.ErrLocked) {
		return fleeting.ProviderInfo{}, fmt.Errorf("local plugin: state dir %s is in use by another plugin process: %w", g.StateDir, err)
	}
	if err != nil {
		return fleeting.ProviderInfo{}, fmt.Errorf("local plugin: %w", err)
	}
	keyPEM, signer, err := loadOrCreateKey(filepath.Join(g.StateDir, "id_ed25519"))
	if err != nil {
		lock.Close()
		return fleeting.ProviderInfo{}, fmt.Errorf("local plugin: client key: %w", err)
	}
	auth := []string{strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))}
	if len(settings.Key) > 0 {
		s, err := ssh.ParsePrivateKey(settings.Key)
		if err != nil {
			lock.Close()
			return fleeting.ProviderInfo{}, fmt.Errorf("local plugin: connector key: %w", err)
		}
		auth = append(auth, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))))
	}
	username := settings.Username
	if username == "" {
		if u, err := user.Current(); err == nil {
			username = u.Username
		}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	g.lock, g.logger, g.settings, g.username, g.keyPEM, g.authKeys = lock, logger, settings, username, keyPEM, auth
	if err := g.removeHalfCreated(); err != nil {
		lock.Close()
		return fleeting.ProviderInfo{}, fmt.Errorf("local plugin: %w", err)
	}
	g.init = true
	return fleeting.ProviderInfo{ID: "local/" + g.Name, MaxSize: g.MaxInstances}, nil
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

func (g *Group) instancesDir() string { return filepath.Join(g.StateDir, "instances") }

// load reads every instance record, ordered by creation.
func (g *Group) load() ([]*instance, error) {
	entries, err := os.ReadDir(g.instancesDir())
	if err != nil {
		return nil, err
	}
	var out []*instance
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(g.instancesDir(), e.Name())
		b, err := os.ReadFile(filepath.Join(dir, instanceFile))
		if errors.Is(err, os.ErrNotExist) {
			continue // half-created: its creator finishes or removes it (removeHalfCreated if it died)
		}
		if err != nil {
			return nil, err
		}
		var in instance
		if err := json.Unmarshal(b, &in); err != nil {
			return nil, fmt.Errorf("instance %s: %w", e.Name(), err)
		}
		in.dir = dir
		out = append(out, &in)
	}
	slices.SortFunc(out, func(a, b *instance) int { return a.N - b.N })
	return out, nil
}

// removeHalfCreated tears down the instance directories that have no
// record: a plugin process died between making one and saving its record,
// perhaps with the instance's server already started. Nobody lists such an
// instance, so nobody would ever delete it. Only the process holding the
// state lock creates instances, so at Init none is being created.
func (g *Group) removeHalfCreated() error {
	entries, err := os.ReadDir(g.instancesDir())
	if err != nil {
		return err
	}
	for _, e := range entries {
		dir := filepath.Join(g.instancesDir(), e.Name())
		if !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, instanceFile)); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		in := &instance{ID: e.Name(), dir: dir}
		if g.NetNS {
			in.NetNS = netnsName(g.StateDir, in.ID)
		}
		g.logger.Warn("removing an instance a previous plugin process left half-created", "instance", in.ID)
		if err := g.teardown(in); err != nil {
			return fmt.Errorf("removing half-created instance %s: %w", in.ID, err)
		}
	}
	return nil
}

func (g *Group) save(in *instance) error {
	b, err := json.MarshalIndent(in, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(in.dir, instanceFile), b, 0o600)
}

// alive reports whether in's server process runs (not a zombie, and really
// the server of this instance, not a recycled pid).
func (in *instance) alive() bool {
	if in.PID <= 0 {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(in.PID) + "/stat")
	if err != nil {
		return false
	}
	if i := strings.LastIndexByte(string(stat), ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(in.PID) + "/cmdline")
	return err == nil && strings.Contains(string(cmdline), in.dir)
}

func (in *instance) addr() string {
	b, err := os.ReadFile(filepath.Join(in.dir, addrFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Update implements fleeting.InstanceGroup. It also reconciles: a server
// that died is started again, and deleted instances are cleaned up once
// their server has exited.
func (g *Group) Update(ctx context.Context, fn func(string, fleeting.State)) error {
	g.mu.Lock()
	if err := g.check(ctx); err != nil {
		g.mu.Unlock()
		return err
	}
	ins, err := g.load()
	if err != nil {
		g.mu.Unlock()
		return fmt.Errorf("local plugin: reading instances: %w", err)
	}
	type report struct {
		id string
		st fleeting.State
	}
	var out []report
	for _, in := range ins {
		st, listed := g.reconcile(in)
		if listed {
			out = append(out, report{in.ID, st})
		}
	}
	g.mu.Unlock()
	for _, r := range out {
		fn(r.id, r.st)
	}
	return nil
}

// reconcile moves one instance towards what it should be and returns its
// state. Called with g.mu held.
func (g *Group) reconcile(in *instance) (fleeting.State, bool) {
	alive := in.alive()
	if !in.Deleting.IsZero() {
		if alive {
			if time.Since(in.Deleting) > 5*time.Second {
				syscall.Kill(in.PID, syscall.SIGKILL)
			}
			return fleeting.StateDeleting, true
		}
		if err := g.teardown(in); err != nil {
			g.logger.Error("deleting instance", "instance", in.ID, "error", err)
			return fleeting.StateDeleting, true
		}
		return fleeting.StateDeleted, false
	}
	if alive {
		if a := in.addr(); a != "" {
			if in.Port == 0 {
				// Keep the port the kernel chose, so a restarted server
				// comes back on the same address.
				if p, err := netip.ParseAddrPort(a); err == nil {
					in.Port = int(p.Port())
					g.save(in)
				}
			}
			return fleeting.StateRunning, true
		}
		return fleeting.StateCreating, true
	}
	g.logger.Warn("instance server is not running; starting it again", "instance", in.ID, "log", filepath.Join(in.dir, logFile))
	if err := g.spawn(in); err != nil {
		g.logger.Error("restarting instance server failed", "instance", in.ID, "error", err)
		return fleeting.StateTimeout, true
	}
	return fleeting.StateCreating, true
}

// Increase implements fleeting.InstanceGroup: each new instance is a new
// server process.
func (g *Group) Increase(ctx context.Context, n int) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(ctx); err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, nil
	}
	ins, err := g.load()
	if err != nil {
		return 0, fmt.Errorf("local plugin: reading instances: %w", err)
	}
	fit := min(n, g.MaxInstances-len(ins))
	if fit <= 0 {
		return 0, fmt.Errorf("local plugin: %d of %d instances exist: %w", len(ins), g.MaxInstances, fleeting.ErrQuotaExceeded)
	}
	created := 0
	var firstErr error
	for range fit {
		if err := g.create(); err != nil {
			firstErr = err
			break
		}
		created++
	}
	if created == 0 {
		return 0, fmt.Errorf("local plugin: creating an instance: %w", firstErr)
	}
	if firstErr != nil {
		g.logger.Error("creating an instance failed", "created", created, "error", firstErr)
	}
	return created, nil
}

// create allocates, configures and starts one instance. Called with g.mu
// held.
func (g *Group) create() error {
	var st groupState
	statePath := filepath.Join(g.StateDir, "state.json")
	if b, err := os.ReadFile(statePath); err == nil {
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("%s: %w", statePath, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// Instance numbers are never reused, but addresses are: take the
	// lowest free slot for the address.
	st.Next++
	b, _ := json.Marshal(st)
	if err := writeFileAtomic(statePath, b, 0o600); err != nil {
		return err
	}
	slot, err := g.freeSlot()
	if err != nil {
		return err
	}
	in := &instance{
		ID:      fmt.Sprintf("%s-%d", g.Name, st.Next),
		N:       slot,
		Created: time.Now().UTC(),
		Port:    g.Port,
	}
	in.dir = filepath.Join(g.instancesDir(), in.ID)
	if g.NetNS {
		p := netip.MustParsePrefix(g.NetNSRange).Masked().Addr().As4()
		base := uint32(p[0])<<24 | uint32(p[1])<<16 | uint32(p[2])<<8 | uint32(p[3])
		in.HostIP = u32ToAddr(base + uint32(4*slot) + 1).String()
		in.IP = u32ToAddr(base + uint32(4*slot) + 2).String()
		in.NetNS = netnsName(g.StateDir, in.ID)
		if in.Port == 0 {
			in.Port = 22
		}
	} else {
		p := netip.MustParsePrefix(g.AddressRange).Masked().Addr().As4()
		base := uint32(p[0])<<24 | uint32(p[1])<<16 | uint32(p[2])<<8 | uint32(p[3])
		in.IP = u32ToAddr(base + uint32(slot)).String()
	}
	if err := os.MkdirAll(filepath.Join(in.dir, "home"), 0o700); err != nil {
		return err
	}
	if err := g.spawn(in); err != nil {
		g.teardown(in)
		return err
	}
	return nil
}

// freeSlot returns the lowest slot (1…) no instance holds.
func (g *Group) freeSlot() (int, error) {
	ins, err := g.load()
	if err != nil {
		return 0, err
	}
	used := map[int]bool{}
	for _, in := range ins {
		used[in.N] = true
	}
	for n := 1; ; n++ {
		if !used[n] {
			return n, nil
		}
	}
}

func u32ToAddr(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// spawn writes the server configuration and starts the server process,
// detached from the plugin (its own session, output to a log file), so it
// outlives a plugin restart. Called with g.mu held.
func (g *Group) spawn(in *instance) error {
	cfg := serverConfig{
		Listen:         netip.AddrPortFrom(netip.MustParseAddr(in.IP), uint16(in.Port)).String(),
		Username:       g.username,
		Password:       g.settings.Password,
		AuthorizedKeys: g.authKeys,
		Shell:          g.Shell,
		Dir:            filepath.Join(in.dir, "home"),
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(in.dir, serverConfigFile), b, 0o600); err != nil {
		return err
	}
	os.Remove(filepath.Join(in.dir, addrFile))
	if in.NetNS != "" {
		if err := setupNetns(in); err != nil {
			return fmt.Errorf("network namespace for %s: %w", in.ID, err)
		}
	}
	argv := append(slices.Clone(g.ServerArgv), in.dir)
	if in.NetNS != "" {
		argv = append([]string{"ip", "netns", "exec", in.NetNS}, argv...)
	}
	log, err := os.OpenFile(filepath.Join(in.dir, logFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	// Every process of the instance inherits the mark: deleting the
	// instance kills them all, also those that left the server's session.
	cmd.Env = append(os.Environ(), "HOME="+cfg.Dir, InstanceMarkVariable+"="+in.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting instance server: %w", err)
	}
	go cmd.Wait() // reap it while this plugin process lives
	in.PID = cmd.Process.Pid
	return g.save(in)
}

// teardown stops what is left of an instance and removes it. Called with
// g.mu held.
func (g *Group) teardown(in *instance) error {
	if in.alive() {
		syscall.Kill(in.PID, syscall.SIGKILL)
	}
	// What ran on the instance goes with it, as on a machine that is
	// switched off.
	for range 50 {
		n, err := reap.SignalEnv(InstanceMarkVariable, in.dir, syscall.SIGKILL)
		if err != nil || n == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if in.NetNS != "" {
		if err := deleteNetns(in.NetNS); err != nil {
			return err
		}
	}
	return os.RemoveAll(in.dir)
}

// Decrease implements fleeting.InstanceGroup: the server is asked to stop
// (SIGTERM, SIGKILL after 5 s); the instance is gone once it has.
func (g *Group) Decrease(ctx context.Context, ids []string) ([]string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(ctx); err != nil {
		return nil, err
	}
	ins, err := g.load()
	if err != nil {
		return nil, fmt.Errorf("local plugin: reading instances: %w", err)
	}
	var ok []string
	for _, in := range ins {
		if !slices.Contains(ids, in.ID) || !in.Deleting.IsZero() {
			continue
		}
		in.Deleting = time.Now().UTC()
		if err := g.save(in); err != nil {
			return ok, fmt.Errorf("local plugin: deleting %s: %w", in.ID, err)
		}
		if in.alive() {
			syscall.Kill(in.PID, syscall.SIGTERM)
		}
		ok = append(ok, in.ID)
	}
	return ok, nil
}

func (g *Group) find(id string) (*instance, error) {
	ins, err := g.load()
	if err != nil {
		return nil, fmt.Errorf("local plugin: reading instances: %w", err)
	}
	for _, in := range ins {
		if in.ID == id {
			return in, nil
		}
	}
	return nil, &fleeting.InstanceError{ID: id, Err: fleeting.ErrInstanceNotFound}
}

// ConnectInfo implements fleeting.InstanceGroup. Internal and external
// address are the same: the address the server listens on.
func (g *Group) ConnectInfo(ctx context.Context, id string) (fleeting.ConnectInfo, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(ctx); err != nil {
		return fleeting.ConnectInfo{}, err
	}
	in, err := g.find(id)
	if err != nil {
		return fleeting.ConnectInfo{}, err
	}
	cc := g.settings.ConnectorConfig
	cc.Protocol = fleeting.ProtocolSSH
	cc.OS, cc.Arch = runtime.GOOS, runtime.GOARCH
	cc.Username = g.username
	if len(cc.Key) == 0 {
		cc.Key = g.keyPEM
	}
	addr := in.addr()
	if addr == "" {
		addr = in.IP
		if in.Port != 0 {
			addr = netip.AddrPortFrom(netip.MustParseAddr(in.IP), uint16(in.Port)).String()
		}
	}
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		cc.ProtocolPort = int(ap.Port())
	}
	return fleeting.ConnectInfo{ConnectorConfig: cc, ID: id, InternalAddr: addr, ExternalAddr: addr}, nil
}

// Heartbeat implements fleeting.InstanceGroup: an instance whose server is
// not running is unhealthy.
func (g *Group) Heartbeat(ctx context.Context, id string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.check(ctx); err != nil {
		return err
	}
	in, err := g.find(id)
	if err != nil {
		return err
	}
	if !in.alive() {
		return &fleeting.InstanceError{ID: id, Err: fmt.Errorf("%w: ssh server not running", fleeting.ErrInstanceUnhealthy)}
	}
	return nil
}

// Shutdown implements fleeting.InstanceGroup: it releases the state
// directory. Instances keep running.
func (g *Group) Shutdown(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.init {
		return ctx.Err()
	}
	g.init = false
	err := g.lock.Close()
	g.lock = nil
	return err
}
