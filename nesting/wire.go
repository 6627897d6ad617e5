package nesting

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/nesting/internal/pb"
)

// wireServer puts a Server on the wire: pb messages in, Go calls, errors
// mapped to gRPC status once, here.
type wireServer struct {
	pb.UnimplementedNestingServer
	s *Server
}

func (w *wireServer) Init(ctx context.Context, req *pb.InitRequest) (*pb.InitResponse, error) {
	if err := w.s.Init(ctx, req.GetConfig()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.InitResponse{}, nil
}

func (w *wireServer) Create(ctx context.Context, req *pb.CreateRequest) (*pb.CreateResponse, error) {
	vm, stomped, err := w.s.Create(ctx, req.GetName(), req.Slot)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &pb.CreateResponse{Vm: toPB(vm)}
	if stomped != "" {
		resp.StompedVmId = &stomped
	}
	return resp, nil
}

func (w *wireServer) Delete(ctx context.Context, req *pb.DeleteRequest) (*pb.DeleteResponse, error) {
	if err := w.s.Delete(ctx, req.GetId()); err != nil {
		return nil, toStatus(err)
	}
	return &pb.DeleteResponse{}, nil
}

func (w *wireServer) List(ctx context.Context, _ *pb.ListRequest) (*pb.ListResponse, error) {
	vms, err := w.s.List(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &pb.ListResponse{Vms: make([]*pb.VirtualMachine, 0, len(vms))}
	for _, vm := range vms {
		resp.Vms = append(resp.Vms, toPB(vm))
	}
	return resp, nil
}

func (w *wireServer) Shutdown(ctx context.Context, _ *pb.ShutdownRequest) (*pb.ShutdownResponse, error) {
	if err := w.s.Shutdown(ctx); err != nil {
		return nil, toStatus(err)
	}
	return &pb.ShutdownResponse{}, nil
}

func toPB(vm VirtualMachine) *pb.VirtualMachine {
	return &pb.VirtualMachine{Id: vm.ID, Name: vm.Name, Addr: vm.Addr}
}

func fromPB(vm *pb.VirtualMachine) VirtualMachine {
	return VirtualMachine{ID: vm.GetId(), Name: vm.GetName(), Addr: vm.GetAddr()}
}

// toStatus maps an error of the Server to a gRPC status error. The two
// initialization errors go out with exactly upstream's messages, "not
// initialized" and "already initialized": upstream declares them as status
// values, and a status error matches one only on equal code and message.
func toStatus(err error) error {
	switch {
	case errors.Is(err, ErrNotInitialized):
		return status.Error(codes.FailedPrecondition, ErrNotInitialized.Error())
	case errors.Is(err, ErrAlreadyInitialized):
		return status.Error(codes.FailedPrecondition, ErrAlreadyInitialized.Error())
	case errors.Is(err, ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

// fromStatus maps an error of a gRPC call back to the contract's errors: the
// result reads as the daemon's message and wraps the matching sentinel and
// the status error. When ctx is done it wraps ctx.Err().
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
	var class error
	switch st.Code() {
	case codes.FailedPrecondition:
		// By message, as upstream clients do: both are FailedPrecondition.
		switch {
		case strings.Contains(st.Message(), ErrNotInitialized.Error()):
			class = ErrNotInitialized
		case strings.Contains(st.Message(), ErrAlreadyInitialized.Error()):
			class = ErrAlreadyInitialized
		}
	case codes.NotFound:
		class = ErrNotFound
	}
	return &wireError{msg: st.Message(), class: class, status: err}
}

// wireError is an error answered by a daemon.
type wireError struct {
	msg    string
	class  error // a sentinel, or nil
	status error // the gRPC status error
}

func (e *wireError) Error() string {
	if st, _ := status.FromError(e.status); st.Code() == codes.Unavailable {
		return "nesting daemon unavailable: " + e.msg
	}
	return e.msg
}

func (e *wireError) Unwrap() []error {
	if e.class != nil {
		return []error{e.class, e.status}
	}
	return []error{e.status}
}
