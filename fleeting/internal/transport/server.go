package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/internal/pb"
)

// Server serves one fleeting.InstanceGroup as the gRPC service
// proto.InstanceGroup.
type Server struct {
	pb.UnimplementedInstanceGroupServer

	// Impl is the plugin's implementation. Before Impl.Init the plugin
	// configuration from InitRequest.config is decoded into it with
	// DecodeConfig.
	Impl fleeting.InstanceGroup
	// Logger is handed to Impl.Init. Required.
	Logger *slog.Logger
	// Version and BuildInfo fill the fields of the same name in
	// InitResponse when Impl leaves them empty.
	Version   string
	BuildInfo string
}

// Init implements pb.InstanceGroupServer.
func (s *Server) Init(ctx context.Context, req *pb.InitRequest) (*pb.InitResponse, error) {
	if err := DecodeConfig(req.GetConfig(), s.Impl); err != nil {
		return nil, toStatus(fmt.Errorf("decoding plugin config: %w", err))
	}
	settings := fleeting.Settings{ConnectorConfig: connectorFromPB(req.GetSettings().GetConnectorConfig())}
	info, err := s.Impl.Init(ctx, s.Logger, settings)
	if err != nil {
		return nil, toStatus(err)
	}
	if info.Version == "" {
		info.Version = s.Version
	}
	if info.BuildInfo == "" {
		info.BuildInfo = s.BuildInfo
	}
	size := info.MaxSize
	if size < 0 {
		size = 0
	}
	if size > math.MaxUint32 {
		size = math.MaxUint32
	}
	return &pb.InitResponse{Id: info.ID, MaxSize: uint32(size), Version: info.Version, BuildInfo: info.BuildInfo}, nil
}

// Update implements pb.InstanceGroupServer.
func (s *Server) Update(_ *pb.Empty, stream grpc.ServerStreamingServer[pb.UpdateResponse]) error {
	var (
		mu      sync.Mutex
		sendErr error
	)
	err := s.Impl.Update(stream.Context(), func(id string, state fleeting.State) {
		mu.Lock()
		defer mu.Unlock()
		if sendErr != nil {
			return
		}
		st, err := stateToPB(state)
		if err != nil {
			sendErr = fmt.Errorf("instance %s: %w", id, err)
			return
		}
		sendErr = stream.Send(&pb.UpdateResponse{Instance: id, State: st})
	})
	mu.Lock()
	defer mu.Unlock()
	return toStatus(errors.Join(err, sendErr))
}

// Increase implements pb.InstanceGroupServer.
func (s *Server) Increase(ctx context.Context, req *pb.IncreaseRequest) (*pb.IncreaseResponse, error) {
	n, err := s.Impl.Increase(ctx, int(req.GetN()))
	if err != nil {
		return nil, toStatus(err)
	}
	if n < 0 {
		n = 0
	}
	return &pb.IncreaseResponse{Succeeded: uint32(min(n, math.MaxUint32))}, nil
}

// Decrease implements pb.InstanceGroupServer.
func (s *Server) Decrease(ctx context.Context, req *pb.DecreaseRequest) (*pb.DecreaseResponse, error) {
	ids, err := s.Impl.Decrease(ctx, req.GetInstances())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.DecreaseResponse{Succeeded: ids}, nil
}

// ConnectInfo implements pb.InstanceGroupServer.
func (s *Server) ConnectInfo(ctx context.Context, req *pb.ConnectInfoRequest) (*pb.ConnectInfoResponse, error) {
	info, err := s.Impl.ConnectInfo(ctx, req.GetInstance())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ConnectInfoResponse{
		Connector:    connectorToPB(info.ConnectorConfig),
		ExternalAddr: info.ExternalAddr,
		InternalAddr: info.InternalAddr,
		Expires:      expiresToPB(info.Expires),
	}, nil
}

// Heartbeat implements pb.InstanceGroupServer.
func (s *Server) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.Empty, error) {
	if err := s.Impl.Heartbeat(ctx, req.GetInstance()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.Empty{}, nil
}

// Shutdown implements pb.InstanceGroupServer.
func (s *Server) Shutdown(ctx context.Context, _ *pb.Empty) (*pb.Empty, error) {
	if err := s.Impl.Shutdown(ctx); err != nil {
		return nil, toStatus(err)
	}
	return &pb.Empty{}, nil
}

// ConfigDecoder is implemented by plugins that decode their configuration
// themselves instead of letting DecodeConfig unmarshal it into them.
type ConfigDecoder interface {
	DecodeConfig(data []byte) error
}

// DecodeConfig decodes a plugin_config JSON document into target, the
// plugin's implementation. If target implements ConfigDecoder that decides;
// otherwise target must be a pointer (usually to the plugin struct, whose
// exported fields, or those of an embedded Config struct, carry json tags)
// and the document must be one JSON object whose keys all name fields:
// unknown keys are an error, so a typo in config.toml is reported at Init
// instead of being silently ignored. An empty document or "null" decodes as
// "{}".
func DecodeConfig(data []byte, target any) error {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		trimmed = []byte("{}")
	}
	if d, ok := target.(ConfigDecoder); ok {
		return d.DecodeConfig(trimmed)
	}
	if trimmed[0] != '{' {
		return errors.New("plugin config must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(target); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("plugin config has trailing data after the JSON object")
	}
	return nil
}

// GRPCPlugin is the go-plugin plugin "instancegroup".
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Service is what the plugin side serves; nil on the host side.
	Service *Server
}

// GRPCServer implements plugin.GRPCPlugin.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Service == nil {
		return errors.New("fleeting: no instance group to serve")
	}
	pb.RegisterInstanceGroupServer(s, p.Service)
	return nil
}

// GRPCClient implements plugin.GRPCPlugin. It returns a *Client without
// plugin configuration; the host sets it with SetConfig before Init.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return NewClient(conn, nil), nil
}
