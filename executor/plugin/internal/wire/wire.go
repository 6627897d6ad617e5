// Package wire is what the host side (executor/plugin) and the plugin side
// (executor/plugin/sdk) of the executor plugin protocol share: the go-plugin
// handshake, the plugin set, and the conversions between the executor
// contract and the messages of executor.proto. Conversions live here and
// nowhere else.
package wire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/plugin/internal/pb"
	"github.com/berthci/berth/runnerapi"
)

// The handshake. Changing the cookie breaks every plugin; a new protocol
// version is added beside ProtocolVersion, never in its place.
const (
	// ProtocolVersion is the executor protocol version this build speaks
	// (the "1" in the handshake line "1|1|unix|<socket>|grpc").
	ProtocolVersion = 1
	// MagicCookieKey and MagicCookieValue are the environment variable the
	// host sets so that a plugin binary knows it is run as a plugin.
	MagicCookieKey   = "BERTH_EXECUTOR_PLUGIN"
	MagicCookieValue = "eff7eca1-2d15-4b94-8aa8-0bbe64abd02a"
	// PluginName is the name of the only plugin in the plugin set.
	PluginName = "executor"
	// ServiceName is the full gRPC service name.
	ServiceName = "berth.executor.v1.Executor"
)

// ProtocolVersions are the versions this build speaks, newest first.
var ProtocolVersions = []int{ProtocolVersion}

// Handshake is the go-plugin handshake configuration.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   MagicCookieKey,
	MagicCookieValue: MagicCookieValue,
}

// Capabilities a plugin advertises in DescribeResponse.capabilities.
const (
	CapabilitySweep = "sweep"
)

// PluginSet returns the versioned plugin set both sides use. server is
// the plugin side's implementation; nil on the host side.
func PluginSet(server pb.ExecutorServer) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		ProtocolVersion: {PluginName: &GRPCPlugin{Impl: server}},
	}
}

// GRPCPlugin is the go-plugin plugin "executor".
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl is what the plugin side serves; nil on the host side.
	Impl pb.ExecutorServer
}

// GRPCServer implements plugin.GRPCPlugin.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("executor plugin: nothing to serve")
	}
	pb.RegisterExecutorServer(s, p.Impl)
	return nil
}

// GRPCClient implements plugin.GRPCPlugin: it returns a pb.ExecutorClient.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return pb.NewExecutorClient(conn), nil
}

// MaxMessageSize bounds a message both ways (job payloads with many
// variables and long scripts stay far below it).
const MaxMessageSize = math.MaxInt32

// NewGRPCServer builds the plugin's gRPC server; it is go-plugin's
// ServeConfig.GRPCServer.
func NewGRPCServer(opts []grpc.ServerOption) *grpc.Server {
	opts = append(opts, grpc.MaxRecvMsgSize(MaxMessageSize), grpc.MaxSendMsgSize(MaxMessageSize))
	return grpc.NewServer(opts...)
}

// ErrCanceled is the error of a plugin-side failure of kind CANCELED when
// the host did not cancel (it should not happen; the host reports it as a
// system failure).
var ErrCanceled = errors.New("canceled by the plugin")

// ErrConfig is the error of a failure of kind CONFIG.
var ErrConfig = errors.New("invalid plugin configuration")

// ToFailure turns an error of the executor contract into a Failure; nil
// for nil.
func ToFailure(err error) *pb.Failure {
	if err == nil {
		return nil
	}
	kind := pb.Failure_SYSTEM
	switch {
	case errors.Is(err, executor.ErrNotPrepared):
		kind = pb.Failure_NOT_PREPARED
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		kind = pb.Failure_CANCELED
	case errors.Is(err, executor.ErrImagePull):
		kind = pb.Failure_IMAGE_PULL
	case errors.Is(err, executor.ErrNotAllowed):
		kind = pb.Failure_NOT_ALLOWED
	case errors.Is(err, ErrConfig):
		kind = pb.Failure_CONFIG
	}
	return &pb.Failure{Kind: kind, Message: err.Error()}
}

// FromFailure turns a Failure into an error the runner classifies as the
// in-process executor's would be: wrapping executor.ErrNotPrepared,
// ErrImagePull, ErrNotAllowed, ErrConfig or ErrCanceled by kind. nil for
// nil.
func FromFailure(f *pb.Failure) error {
	if f == nil {
		return nil
	}
	msg := f.GetMessage()
	if msg == "" {
		msg = "no message"
	}
	var sentinel error
	switch f.GetKind() {
	case pb.Failure_NOT_PREPARED:
		sentinel = executor.ErrNotPrepared
	case pb.Failure_CANCELED:
		sentinel = ErrCanceled
	case pb.Failure_IMAGE_PULL:
		sentinel = executor.ErrImagePull
	case pb.Failure_NOT_ALLOWED:
		sentinel = executor.ErrNotAllowed
	case pb.Failure_CONFIG:
		sentinel = ErrConfig
	default:
		return &RemoteError{Msg: msg}
	}
	return &RemoteError{Msg: msg, Kind: sentinel}
}

// RemoteError is an error reported by the plugin.
type RemoteError struct {
	Msg  string
	Kind error // a sentinel, or nil for a system failure
}

func (e *RemoteError) Error() string { return e.Msg }

// Unwrap lets errors.Is find the sentinel of the failure's kind.
func (e *RemoteError) Unwrap() error { return e.Kind }

// FeaturesToMap lists the features set in f by their Runner API names.
func FeaturesToMap(f runnerapi.Features) map[string]bool {
	b, _ := json.Marshal(f)
	var all map[string]bool
	_ = json.Unmarshal(b, &all)
	out := map[string]bool{}
	for k, v := range all {
		if v {
			out[k] = true
		}
	}
	return out
}

// ApplyFeatures sets in f every feature m offers and leaves the others
// as they are; unknown names are ignored (a newer plugin may know more
// features than this host).
func ApplyFeatures(f *runnerapi.Features, m map[string]bool) {
	on := map[string]bool{}
	for k, v := range m {
		if v {
			on[k] = true
		}
	}
	b, _ := json.Marshal(on)
	_ = json.Unmarshal(b, f)
}

// EnvironmentToPB converts an environment.
func EnvironmentToPB(e executor.Environment) *pb.Environment {
	out := &pb.Environment{BuildDir: e.BuildDir, TmpDir: e.TmpDir, CacheDir: e.CacheDir, Shell: e.Shell, Helper: e.Helper, Hostname: e.Hostname}
	for _, v := range e.Variables {
		out.Variables = append(out.Variables, &pb.Variable{Key: v.Key, Value: v.Value, Masked: v.Masked, File: v.File})
	}
	return out
}

// EnvironmentFromPB converts an environment, checking that what the
// runner needs is there.
func EnvironmentFromPB(e *pb.Environment) (executor.Environment, error) {
	env := executor.Environment{
		BuildDir: e.GetBuildDir(), TmpDir: e.GetTmpDir(), CacheDir: e.GetCacheDir(),
		Shell: e.GetShell(), Helper: e.GetHelper(), Hostname: e.GetHostname(),
	}
	for _, v := range e.GetVariables() {
		if v.GetKey() == "" {
			continue
		}
		env.Variables = append(env.Variables, runnerapi.Variable{Key: v.GetKey(), Value: v.GetValue(), Masked: v.GetMasked(), File: v.GetFile(), Public: !v.GetMasked()})
	}
	var missing []string
	for name, v := range map[string]string{"build_dir": env.BuildDir, "tmp_dir": env.TmpDir, "shell": env.Shell, "helper": env.Helper} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return env, fmt.Errorf("the plugin's environment lacks %v", missing)
	}
	if env.Shell != "bash" && env.Shell != "sh" {
		return env, fmt.Errorf("the plugin's environment has shell %q (want bash or sh)", env.Shell)
	}
	return env, nil
}
