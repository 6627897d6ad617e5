package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/internal/pb"
)

// Client is a fleeting.InstanceGroup whose implementation is on the other
// side of a gRPC connection.
type Client struct {
	rpc    pb.InstanceGroupClient
	config []byte
}

var _ fleeting.InstanceGroup = (*Client)(nil)

// NewClient returns a client over conn. config is the plugin_config JSON
// sent in Init; nil sends "{}" (the upstream plugin SDK fails to decode an
// empty document).
func NewClient(conn grpc.ClientConnInterface, config []byte) *Client {
	return &Client{rpc: pb.NewInstanceGroupClient(conn), config: config}
}

// SetConfig sets the plugin_config JSON sent by Init. It must be called
// before Init.
func (c *Client) SetConfig(config []byte) { c.config = config }

// Init implements fleeting.InstanceGroup. logger is unused: the plugin logs
// to its stderr, which the host relays.
func (c *Client) Init(ctx context.Context, _ *slog.Logger, settings fleeting.Settings) (fleeting.ProviderInfo, error) {
	config := c.config
	if len(config) == 0 {
		config = []byte("{}")
	}
	resp, err := c.rpc.Init(ctx, &pb.InitRequest{
		Config:   config,
		Settings: &pb.Settings{ConnectorConfig: connectorToPB(settings.ConnectorConfig)},
	})
	if err != nil {
		return fleeting.ProviderInfo{}, fromStatus(ctx, err)
	}
	return fleeting.ProviderInfo{
		ID:        resp.GetId(),
		MaxSize:   int(resp.GetMaxSize()),
		Version:   resp.GetVersion(),
		BuildInfo: resp.GetBuildInfo(),
	}, nil
}

// Update implements fleeting.InstanceGroup. fn is called as instances
// arrive on the stream; on error some may have been reported already, and
// the caller must discard them as the contract says.
func (c *Client) Update(ctx context.Context, fn func(id string, state fleeting.State)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.Update(ctx, &pb.Empty{})
	if err != nil {
		return fromStatus(ctx, err)
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fromStatus(ctx, err)
		}
		state, err := stateFromPB(resp.GetState())
		if err != nil {
			return fmt.Errorf("instance %s: %w", resp.GetInstance(), err)
		}
		fn(resp.GetInstance(), state)
	}
}

// Increase implements fleeting.InstanceGroup.
func (c *Client) Increase(ctx context.Context, n int) (int, error) {
	if n < 0 {
		return 0, fmt.Errorf("increase by %d: negative count", n)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, nil
	}
	resp, err := c.rpc.Increase(ctx, &pb.IncreaseRequest{N: uint32(min(n, math.MaxUint32))})
	if err != nil {
		return 0, fromStatus(ctx, err)
	}
	return int(resp.GetSucceeded()), nil
}

// Decrease implements fleeting.InstanceGroup.
func (c *Client) Decrease(ctx context.Context, ids []string) ([]string, error) {
	resp, err := c.rpc.Decrease(ctx, &pb.DecreaseRequest{Instances: ids})
	if err != nil {
		return nil, fromStatus(ctx, err)
	}
	return resp.GetSucceeded(), nil
}

// ConnectInfo implements fleeting.InstanceGroup.
func (c *Client) ConnectInfo(ctx context.Context, id string) (fleeting.ConnectInfo, error) {
	resp, err := c.rpc.ConnectInfo(ctx, &pb.ConnectInfoRequest{Instance: id})
	if err != nil {
		return fleeting.ConnectInfo{}, fromStatus(ctx, err)
	}
	return fleeting.ConnectInfo{
		ConnectorConfig: connectorFromPB(resp.GetConnector()),
		ID:              id,
		ExternalAddr:    resp.GetExternalAddr(),
		InternalAddr:    resp.GetInternalAddr(),
		Expires:         expiresFromPB(resp.GetExpires()),
	}, nil
}

// Heartbeat implements fleeting.InstanceGroup. A plugin without Heartbeat
// (older upstream plugins) is treated as reporting every instance healthy.
func (c *Client) Heartbeat(ctx context.Context, id string) error {
	_, err := c.rpc.Heartbeat(ctx, &pb.HeartbeatRequest{Instance: id})
	if status.Code(err) == codes.Unimplemented && ctx.Err() == nil {
		return nil
	}
	return fromStatus(ctx, err)
}

// Shutdown implements fleeting.InstanceGroup. A plugin without Shutdown is
// treated as succeeding.
func (c *Client) Shutdown(ctx context.Context) error {
	_, err := c.rpc.Shutdown(ctx, &pb.Empty{})
	if status.Code(err) == codes.Unimplemented && ctx.Err() == nil {
		return nil
	}
	return fromStatus(ctx, err)
}
