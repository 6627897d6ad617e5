package nesting

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/berthci/berth/nesting/internal/pb"
)

// Client talks to a nesting daemon — Berth's Server or GitLab's nesting —
// over gRPC. Safe for concurrent use; Close it when done.
//
// Errors answered by the daemon read as its message and match ErrNotFound,
// ErrNotInitialized and ErrAlreadyInitialized with errors.Is; when the call's
// ctx ended they wrap ctx.Err().
type Client struct {
	target string
	conn   *grpc.ClientConn
	rpc    pb.NestingClient
}

// Dialer opens a connection to addr on network ("unix" or "tcp"), like
// net.Dialer.DialContext or the fleeting connector's Client.Dial.
type Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// DialOption configures Dial.
type DialOption func(*dialConfig)

type dialConfig struct {
	dial Dialer
}

// WithDialer makes the client open its connections with d instead of
// net.Dialer: to reach a daemon on a remote instance through an SSH tunnel,
// pass the fleeting connector's Dial, which dials the unix socket path as
// seen on the instance.
func WithDialer(d Dialer) DialOption {
	return func(c *dialConfig) { c.dial = d }
}

// Dial connects to the daemon at target and returns once the connection is
// up (or fails), bounded by ctx; the client reconnects by itself later.
// target is, as upstream:
//
//	""                     unix://DefaultSocket()
//	unix:///abs/path       a unix socket (also unix:/abs/path, or a bare /abs/path)
//	unix:rel/path          a unix socket, relative to the working directory
//	tcp://host:port        TCP (also tcp:host:port, tcp4/tcp6, dns:///host:port, or a bare host:port)
//
// With WithDialer, the path or address is resolved by the dialer, e.g. on
// the remote instance.
func Dial(ctx context.Context, target string, opts ...DialOption) (*Client, error) {
	cfg := dialConfig{dial: (&net.Dialer{}).DialContext}
	for _, o := range opts {
		o(&cfg)
	}
	network, addr, err := ParseTarget(target)
	if err != nil {
		return nil, err
	}
	shown := target
	if shown == "" {
		shown = "unix://" + addr
	}

	var (
		mu      sync.Mutex
		lastErr error
	)
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		c, err := cfg.dial(ctx, network, addr)
		mu.Lock()
		lastErr = err
		mu.Unlock()
		return c, err
	}
	authority := "localhost" // what gRPC sends for unix sockets
	if network != "unix" {
		authority = addr
	}
	conn, err := grpc.NewClient("passthrough:///"+authority,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer),
		grpc.WithAuthority(authority),
	)
	if err != nil {
		return nil, fmt.Errorf("dialing nesting daemon at %s: %w", shown, err)
	}
	conn.Connect()
	for {
		state := conn.GetState()
		if state == connectivity.Ready {
			break
		}
		if state == connectivity.TransientFailure || state == connectivity.Shutdown {
			conn.Close()
			mu.Lock()
			err := lastErr
			mu.Unlock()
			if err == nil {
				err = errors.New("connection failed (is it a nesting daemon?)")
			}
			return nil, fmt.Errorf("dialing nesting daemon at %s: %w", shown, err)
		}
		if !conn.WaitForStateChange(ctx, state) {
			conn.Close()
			return nil, fmt.Errorf("dialing nesting daemon at %s: %w", shown, ctx.Err())
		}
	}
	return &Client{target: shown, conn: conn, rpc: pb.NewNestingClient(conn)}, nil
}

// ParseTarget splits a target — Dial's, or a VM's address — into a network
// and an address (the forms are in docs/nesting.md).
func ParseTarget(target string) (network, addr string, err error) {
	if target == "" {
		return "unix", DefaultSocket(), nil
	}
	if strings.HasPrefix(target, "/") {
		return "unix", target, nil
	}
	scheme, rest, ok := strings.Cut(target, ":")
	switch scheme {
	case "unix":
		if after, ok := strings.CutPrefix(rest, "//"); ok {
			// unix://path: gRPC's form needs an absolute path (unix:///abs).
			if !strings.HasPrefix(after, "/") {
				return "", "", fmt.Errorf("nesting target %q: unix:// needs an absolute path (unix:///abs/path, or unix:rel/path)", target)
			}
			rest = after
		}
		if rest == "" {
			return "", "", fmt.Errorf("nesting target %q: no socket path", target)
		}
		return "unix", filepath.Clean(rest), nil
	case "tcp", "tcp4", "tcp6", "dns":
		rest = strings.TrimPrefix(rest, "//")
		if scheme == "dns" {
			// dns:[//authority]/host:port
			if i := strings.Index(rest, "/"); i >= 0 {
				rest = rest[i+1:]
			}
			scheme = "tcp"
		}
		if _, _, err := net.SplitHostPort(rest); err != nil {
			return "", "", fmt.Errorf("nesting target %q: %w", target, err)
		}
		return scheme, rest, nil
	}
	if ok {
		if _, _, err := net.SplitHostPort(target); err == nil {
			return "tcp", target, nil // host:port
		}
	}
	return "", "", fmt.Errorf("nesting target %q: want unix:///path, unix:path, tcp://host:port or host:port", target)
}

// Target is the daemon's address as given to Dial ("" shown as its
// unix:// default).
func (c *Client) Target() string { return c.target }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Init configures the daemon's hypervisor with config (JSON).
func (c *Client) Init(ctx context.Context, config []byte) error {
	_, err := c.rpc.Init(ctx, &pb.InitRequest{Config: config})
	return fromStatus(ctx, err)
}

// Create makes a VM from image name, in slot if not nil. stomped is the id
// of the VM the slot held, which the daemon deleted ("" if none).
func (c *Client) Create(ctx context.Context, name string, slot *int32) (vm VirtualMachine, stomped string, err error) {
	resp, err := c.rpc.Create(ctx, &pb.CreateRequest{Name: name, Slot: slot})
	if err != nil {
		return VirtualMachine{}, "", fromStatus(ctx, err)
	}
	if resp.GetVm() == nil {
		return VirtualMachine{}, resp.GetStompedVmId(), errors.New("nesting daemon created no vm")
	}
	return fromPB(resp.GetVm()), resp.GetStompedVmId(), nil
}

// Delete deletes the VM id; an unknown id matches ErrNotFound.
func (c *Client) Delete(ctx context.Context, id string) error {
	_, err := c.rpc.Delete(ctx, &pb.DeleteRequest{Id: id})
	return fromStatus(ctx, err)
}

// List returns the daemon's VMs.
func (c *Client) List(ctx context.Context) ([]VirtualMachine, error) {
	resp, err := c.rpc.List(ctx, &pb.ListRequest{})
	if err != nil {
		return nil, fromStatus(ctx, err)
	}
	vms := make([]VirtualMachine, 0, len(resp.GetVms()))
	for _, vm := range resp.GetVms() {
		vms = append(vms, fromPB(vm))
	}
	return vms, nil
}

// Shutdown stops every VM of the daemon and leaves it uninitialized.
func (c *Client) Shutdown(ctx context.Context) error {
	_, err := c.rpc.Shutdown(ctx, &pb.ShutdownRequest{})
	return fromStatus(ctx, err)
}

// CreateInitialized is Create with GitLab Runner's lazy initialization: if
// the daemon is not initialized, it sends Init(config) — another client
// winning that race ("already initialized") is fine — and tries once more.
func (c *Client) CreateInitialized(ctx context.Context, config []byte, name string, slot *int32) (vm VirtualMachine, stomped string, err error) {
	err = c.withInit(ctx, config, func() error {
		vm, stomped, err = c.Create(ctx, name, slot)
		return err
	})
	return vm, stomped, err
}

// ListInitialized is List with the lazy initialization of
// CreateInitialized.
func (c *Client) ListInitialized(ctx context.Context, config []byte) (vms []VirtualMachine, err error) {
	err = c.withInit(ctx, config, func() error {
		vms, err = c.List(ctx)
		return err
	})
	return vms, err
}

func (c *Client) withInit(ctx context.Context, config []byte, call func() error) error {
	err := call()
	if !errors.Is(err, ErrNotInitialized) {
		return err
	}
	if err := c.Init(ctx, config); err != nil && !errors.Is(err, ErrAlreadyInitialized) {
		return fmt.Errorf("initializing nesting daemon: %w", err)
	}
	return call()
}
