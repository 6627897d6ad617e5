package local

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"golang.org/x/crypto/ssh"

	"github.com/berthci/berth/fleeting/internal/sshserver"
)

// ServerCommand is the subcommand of the plugin binary that runs one
// instance's SSH server: `fleeting-plugin-local instance-server <dir>`.
const ServerCommand = "instance-server"

// serverConfig is what the plugin writes into an instance's directory for
// its server.
type serverConfig struct {
	Listen         string   `json:"listen"`
	Username       string   `json:"username"`
	Password       string   `json:"password,omitempty"`
	AuthorizedKeys []string `json:"authorized_keys"`
	Shell          string   `json:"shell"`
	Dir            string   `json:"dir"`
}

// Files in an instance directory.
const (
	serverConfigFile = "server.json"
	hostKeyFile      = "ssh_host_ed25519_key"
	addrFile         = "addr" // written by the server once it listens
	logFile          = "server.log"
	instanceFile     = "instance.json"
)

// RunServer is the instance server: it serves SSH as configured in
// dir/server.json, writes the address it listens on to dir/addr, and runs
// until SIGTERM or SIGINT. The plugin binary runs it as its
// "instance-server" subcommand; args is [dir].
func RunServer(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: %s <instance dir>", ServerCommand)
	}
	dir := args[0]
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("instance_dir", dir)
	b, err := os.ReadFile(filepath.Join(dir, serverConfigFile))
	if err != nil {
		return err
	}
	var cfg serverConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("%s: %w", serverConfigFile, err)
	}
	_, hostKey, err := loadOrCreateKey(filepath.Join(dir, hostKeyFile))
	if err != nil {
		return err
	}
	var keys []ssh.PublicKey
	for _, line := range cfg.AuthorizedKeys {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			return fmt.Errorf("authorized key %q: %w", line, err)
		}
		keys = append(keys, k)
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, addrFile), []byte(l.Addr().String()), 0o644); err != nil {
		l.Close()
		return err
	}
	logger.Info("serving ssh", "addr", l.Addr().String())
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv := &sshserver.Server{
		HostKey:        hostKey,
		AuthorizedKeys: keys,
		Password:       cfg.Password,
		Username:       cfg.Username,
		Shell:          cfg.Shell,
		Dir:            cfg.Dir,
		Logger:         logger,
	}
	err = srv.Serve(ctx, l)
	os.Remove(filepath.Join(dir, addrFile))
	return err
}

// RunServerIfAsked runs the instance server and exits the process when the
// command line is `<binary> instance-server <dir>`; otherwise it returns.
// Test binaries that start in-process local groups (whose default
// ServerArgv is the test binary itself) call it first thing in TestMain.
func RunServerIfAsked() {
	if len(os.Args) < 2 || os.Args[1] != ServerCommand {
		return
	}
	if err := RunServer(context.Background(), os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, ServerCommand+":", err)
		os.Exit(1)
	}
	os.Exit(0)
}
