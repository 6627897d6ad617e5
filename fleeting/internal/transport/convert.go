package transport

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/fleeting/internal/pb"
)

func connectorToPB(c fleeting.ConnectorConfig) *pb.ConnectorConfig {
	return &pb.ConnectorConfig{
		Os:                   c.OS,
		Arch:                 c.Arch,
		Protocol:             string(c.Protocol),
		Username:             c.Username,
		Password:             c.Password,
		Key:                  c.Key,
		UseStaticCredentials: c.UseStaticCredentials,
		Keepalive:            int64(c.Keepalive),
		Timeout:              int64(c.Timeout),
		ProtocolPort:         int64(c.ProtocolPort),
	}
}

func connectorFromPB(c *pb.ConnectorConfig) fleeting.ConnectorConfig {
	if c == nil {
		return fleeting.ConnectorConfig{}
	}
	port := c.GetProtocolPort()
	if port < 0 || port > math.MaxInt32 {
		port = 0
	}
	return fleeting.ConnectorConfig{
		OS:                   c.GetOs(),
		Arch:                 c.GetArch(),
		Protocol:             fleeting.Protocol(c.GetProtocol()),
		Username:             c.GetUsername(),
		Password:             c.GetPassword(),
		Key:                  c.GetKey(),
		UseStaticCredentials: c.GetUseStaticCredentials(),
		Keepalive:            time.Duration(c.GetKeepalive()),
		Timeout:              time.Duration(c.GetTimeout()),
		ProtocolPort:         int(port),
	}
}

func stateToPB(s fleeting.State) (pb.UpdateResponse_State, error) {
	for i, v := range fleeting.States {
		if v == s {
			return pb.UpdateResponse_State(i), nil
		}
	}
	return 0, fmt.Errorf("invalid instance state %q", s)
}

func stateFromPB(s pb.UpdateResponse_State) (fleeting.State, error) {
	if s < 0 || int(s) >= len(fleeting.States) {
		return "", fmt.Errorf("invalid instance state %d on the wire", int32(s))
	}
	return fleeting.States[s], nil
}

func expiresToPB(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}

func expiresFromPB(s int64) time.Time {
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(s, 0)
}

// Error classes on the wire. gRPC status codes are the only classification
// that crosses the process boundary, so each sentinel of the contract has
// one code. A plugin that does not use them (any upstream plugin) yields
// plain errors carrying its message.
var codeOf = []struct {
	err  error
	code codes.Code
}{
	{fleeting.ErrInstanceNotFound, codes.NotFound},
	{fleeting.ErrInstanceUnhealthy, codes.Aborted},
	{fleeting.ErrQuotaExceeded, codes.ResourceExhausted},
	{fleeting.ErrNotInitialized, codes.FailedPrecondition},
	{context.Canceled, codes.Canceled},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
}

// toStatus maps an error of the implementation to a gRPC status error.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	for _, c := range codeOf {
		if errors.Is(err, c.err) {
			return status.Error(c.code, err.Error())
		}
	}
	return status.Error(codes.Unknown, err.Error())
}

// fromStatus maps a gRPC error back to the contract's errors. The result
// reads as the plugin's own message and wraps the matching sentinel; when
// ctx is done it wraps ctx.Err().
func fromStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%w (%v)", ctxErr, err)
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, c := range codeOf {
		if st.Code() == c.code {
			return &wireError{msg: st.Message(), class: c.err, status: err}
		}
	}
	if st.Code() == codes.Unavailable {
		return &wireError{msg: st.Message(), class: ErrUnavailable, status: err}
	}
	return &wireError{msg: st.Message(), status: err}
}

// ErrUnavailable classifies errors where the plugin could not be reached at
// all (its process died or the connection broke).
var ErrUnavailable = errors.New("plugin unavailable")

// wireError is an error received from a plugin.
type wireError struct {
	msg    string
	class  error // a sentinel, or nil
	status error // the gRPC status error
}

func (e *wireError) Error() string {
	if e.class == ErrUnavailable {
		return ErrUnavailable.Error() + ": " + e.msg
	}
	return e.msg
}

func (e *wireError) Unwrap() []error {
	if e.class != nil {
		return []error{e.class, e.status}
	}
	return []error{e.status}
}
