// Package fleeting is the instance-group contract: how Berth's autoscaler
// talks to a group of machines (cloud instances, static hosts, local SSH
// servers, a simulated cloud) without knowing which.
//
// The contract mirrors GitLab's fleeting provider interface
// (gitlab.com/gitlab-org/fleeting/fleeting/provider.InstanceGroup) so that a
// plugin written for one side works on the other. Implementations live
// elsewhere: plugins under fleeting/plugins, the gRPC transport in
// fleeting/internal/transport, the process host in fleeting/host, the SDK for
// plugin authors in fleeting/sdk and the SSH connector in fleeting/connector.
// This package depends on the standard library only.
package fleeting

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// State is the state of one instance as the provider reports it.
//
//	Increase
//	   │
//	   ▼
//	creating ──booted──► running
//	   │                    │
//	   │ Decrease           │ Decrease
//	   ▼                    ▼
//	deleting ◄──────────────┘
//	   │
//	   ▼
//	deleted          timeout (the provider gave up on it, in any state)
//
// deleted and timeout are terminal: the host prunes such instances. An
// instance that Update stops listing is treated as gone, exactly as if it had
// been reported deleted.
type State string

// The states of the reference (gitlab-protocol.md §7.2), in wire order.
const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StateDeleting State = "deleting"
	StateDeleted  State = "deleted"
	StateTimeout  State = "timeout"
)

// States lists every state in wire order (creating = 0 … timeout = 4).
var States = []State{StateCreating, StateRunning, StateDeleting, StateDeleted, StateTimeout}

// Valid reports whether s is one of States.
func (s State) Valid() bool {
	for _, v := range States {
		if s == v {
			return true
		}
	}
	return false
}

// Terminal reports whether an instance in state s is gone for good.
func (s State) Terminal() bool { return s == StateDeleted || s == StateTimeout }

// Protocol is how the connector reaches an instance.
type Protocol string

// Protocols of the reference. Berth's connector implements SSH only; WinRM
// instances can be managed by a plugin but not connected to.
const (
	ProtocolSSH        Protocol = "ssh"
	ProtocolWinRM      Protocol = "winrm"
	ProtocolWinRMHTTPS Protocol = "winrm+https"
)

// DefaultPort returns the port a protocol uses when ProtocolPort is 0: 22
// for ssh (and for an empty protocol), 5985 for winrm, 5986 for winrm+https.
func (p Protocol) DefaultPort() int {
	switch p {
	case ProtocolWinRM:
		return 5985
	case ProtocolWinRMHTTPS:
		return 5986
	default:
		return 22
	}
}

// ConnectorConfig says how to connect to the instances of a group. The host
// passes the operator's settings to the plugin in Init; the plugin may fill
// blanks (a generated key, the OS of the image) and returns the result per
// instance in ConnectInfo. JSON names are those of the reference.
type ConnectorConfig struct {
	OS                   string        `json:"os"`
	Arch                 string        `json:"arch"`
	Protocol             Protocol      `json:"protocol"`
	ProtocolPort         int           `json:"protocol_port"`
	Username             string        `json:"username"`
	Password             string        `json:"password"`
	Key                  []byte        `json:"key"`
	UseStaticCredentials bool          `json:"use_static_credentials"`
	Keepalive            time.Duration `json:"keepalive"`
	Timeout              time.Duration `json:"timeout"`
}

// Port returns ProtocolPort, or the protocol's default port when it is 0.
func (c ConnectorConfig) Port() int {
	if c.ProtocolPort > 0 {
		return c.ProtocolPort
	}
	return c.Protocol.DefaultPort()
}

// Settings are what the host hands to a plugin's Init besides the plugin's
// own configuration (which the plugin has already decoded into itself).
type Settings struct {
	ConnectorConfig
}

// ProviderInfo describes an initialised group.
type ProviderInfo struct {
	// ID names the group, e.g. "aws/eu-west-1/ci-runners". Required.
	ID string
	// MaxSize is the largest number of instances the group can hold, in
	// any state but deleted. 0 means the provider states no limit.
	MaxSize int
	// Version and BuildInfo describe the plugin build.
	Version   string
	BuildInfo string
}

// ConnectInfo is everything needed to connect to one instance.
type ConnectInfo struct {
	ConnectorConfig
	// ID is the instance ID the info is for.
	ID string
	// ExternalAddr and InternalAddr are "host" or "host:port". At least one
	// is set for a running instance. Which one the connector uses is the
	// operator's choice (use_external_addr); if only one is set it is used.
	ExternalAddr string
	InternalAddr string
	// Expires, when non-zero, is when the credentials stop working; the
	// host asks again shortly before. The wire carries whole seconds.
	Expires time.Time
}

// InstanceGroup is one group of instances behind one plugin.
//
// Call order. Init is called first and exactly once per plugin process;
// every other method may only be called after Init succeeded. Shutdown is
// called last; nothing is called after it. Between them the host calls
// Update periodically and Increase, Decrease, ConnectInfo and Heartbeat as it
// needs, possibly concurrently: implementations must be safe for concurrent
// use.
//
// Contexts. Every method honours ctx: a method called with a cancelled
// context returns an error for which errors.Is(err, ctx.Err()) holds, and
// makes no change.
//
// Errors. Wrap the sentinel errors of this package (ErrInstanceNotFound,
// ErrInstanceUnhealthy, ErrQuotaExceeded) so callers can classify them with
// errors.Is; the gRPC transport carries these three classes across the wire.
type InstanceGroup interface {
	// Init validates the plugin's configuration (already decoded into the
	// implementation) and the settings, prepares clients and credentials,
	// and describes the group. logger receives the plugin's structured
	// logs; it is never nil. Init does not create or delete instances, and
	// instances that already exist (from before a restart of the plugin or
	// of the host) stay listed by Update.
	Init(ctx context.Context, logger *slog.Logger, settings Settings) (ProviderInfo, error)

	// Update reports every instance of the group exactly once by calling fn
	// with its ID and current state. The list is complete: an instance that
	// is not reported is treated as gone (as if deleted). fn is never called
	// concurrently and never after Update returns. An error means the list
	// is incomplete and must be ignored, not that instances are gone.
	Update(ctx context.Context, fn func(id string, state State)) error

	// Increase asks for n new instances and returns how many requests were
	// accepted; those instances appear in later Updates, first as creating.
	// If some were accepted the error is nil: the wire cannot carry both a
	// count and an error, so an error always means none were accepted.
	// Requests beyond MaxSize (counting every instance not yet deleted) are
	// not accepted; if none fit the error wraps ErrQuotaExceeded.
	// Increase(ctx, 0) returns 0, nil.
	Increase(ctx context.Context, n int) (int, error)

	// Decrease asks for the given instances to be deleted and returns the
	// IDs whose deletion was accepted, a subset of ids. Unknown IDs and IDs
	// already being deleted are not errors and are left out of the result,
	// so calling Decrease again with the same IDs is safe. Accepted
	// instances are reported as deleting or deleted, or no longer reported,
	// by later Updates. An error carries no list: the caller retries.
	Decrease(ctx context.Context, ids []string) ([]string, error)

	// ConnectInfo returns how to connect to instance id. For an unknown ID
	// the error wraps ErrInstanceNotFound. It may be called in any state but
	// is meaningful for running instances.
	ConnectInfo(ctx context.Context, id string) (ConnectInfo, error)

	// Heartbeat checks instance id; an error wrapping ErrInstanceUnhealthy
	// says the instance should be replaced, one wrapping
	// ErrInstanceNotFound says it is unknown. Plugins with nothing to check
	// return nil for known instances.
	Heartbeat(ctx context.Context, id string) error

	// Shutdown releases what Init acquired (clients, generated keys). It
	// does not delete instances: that is the host's decision
	// (delete_instances_on_shutdown), made with Decrease before Shutdown.
	Shutdown(ctx context.Context) error
}

// Sentinel errors of the contract.
var (
	// ErrInstanceNotFound: the group has no instance with that ID.
	ErrInstanceNotFound = errors.New("instance not found")
	// ErrInstanceUnhealthy: the instance exists but should be replaced.
	ErrInstanceUnhealthy = errors.New("instance unhealthy")
	// ErrQuotaExceeded: the group cannot hold more instances.
	ErrQuotaExceeded = errors.New("instance quota exceeded")
	// ErrNotInitialized: a method was called before Init succeeded.
	ErrNotInitialized = errors.New("instance group not initialized")
)

// InstanceError annotates an error with the instance it is about, reading as
// "instance i-3: <cause>".
type InstanceError struct {
	ID  string
	Err error
}

func (e *InstanceError) Error() string { return fmt.Sprintf("instance %s: %v", e.ID, e.Err) }
func (e *InstanceError) Unwrap() error { return e.Err }
