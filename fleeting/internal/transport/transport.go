// Package transport carries the fleeting.InstanceGroup contract over
// hashicorp/go-plugin and gRPC, byte-compatible with GitLab's fleeting
// (reference/gitlab-protocol.md §7.3, §7.3a). It is shared by the host side
// (fleeting/host) and the plugin side (fleeting/sdk); conversions between the
// contract and the wire live here and nowhere else.
package transport

import (
	"math"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// The handshake of the reference. Changing any of these breaks every
// existing plugin.
const (
	// ProtocolVersion is the application protocol version (the "0" in the
	// handshake line "1|0|unix|<socket>|grpc|").
	ProtocolVersion = 0
	// MagicCookieKey and MagicCookieValue are the environment variable the
	// host sets so that a plugin binary knows it is run as a plugin.
	MagicCookieKey   = "FLEETING_INSTANCE_GROUP_PLUGIN"
	MagicCookieValue = "4c6410b1-cb78-4962-8c76-ab936d0ea908"
	// PluginName is the name of the only plugin in the plugin set.
	PluginName = "instancegroup"
	// ServiceName is the full gRPC service name.
	ServiceName = "proto.InstanceGroup"
)

// Handshake is the go-plugin handshake configuration of the reference.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   MagicCookieKey,
	MagicCookieValue: MagicCookieValue,
}

// PluginSet returns the versioned plugin set both sides use: version 0
// holds one plugin, "instancegroup". server may be nil on the host side.
func PluginSet(server *Server) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		ProtocolVersion: {PluginName: &GRPCPlugin{Service: server}},
	}
}

// MaxMessageSize is the gRPC message size limit both sides use (2^31-1).
const MaxMessageSize = math.MaxInt32

// NewGRPCServer builds the plugin's gRPC server with the message size limit
// of the reference; it is go-plugin's ServeConfig.GRPCServer.
func NewGRPCServer(opts []grpc.ServerOption) *grpc.Server {
	opts = append(opts, grpc.MaxRecvMsgSize(MaxMessageSize), grpc.MaxSendMsgSize(MaxMessageSize))
	return grpc.NewServer(opts...)
}
