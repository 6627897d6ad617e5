package guest

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthci/berth/guest/internal/pb"
)

// minSeed is the least entropy a restored guest takes from the host.
const minSeed = 32

// Restored implements pb.AgentServer: a guest restored from a snapshot
// takes the host name and clock of the VM it now is and mixes the host's
// seed into the kernel's entropy pool, then reseeds the kernel's random
// number generator, so VMs restored from one snapshot do not draw the
// same random numbers. Only in a VM (the agent under init, on the job's
// root): an agent run on a host for tests changes nothing there.
func (a *Agent) Restored(_ context.Context, req *pb.RestoredRequest) (*pb.RestoredResponse, error) {
	if len(req.GetSeed()) < minSeed {
		return nil, status.Errorf(codes.InvalidArgument, "restored: a seed of %d bytes: want at least %d", len(req.GetSeed()), minSeed)
	}
	if !a.inVM() {
		return &pb.RestoredResponse{}, nil
	}
	if n := req.GetUnixNanos(); n > 0 {
		tv := unix.NsecToTimeval(n)
		if err := unix.Settimeofday(&tv); err != nil {
			return nil, status.Errorf(codes.Internal, "restored: setting the clock: %v", err)
		}
	}
	if err := reseed(req.GetSeed()); err != nil {
		return nil, status.Errorf(codes.Internal, "restored: %v", err)
	}
	if h := req.GetHostname(); h != "" {
		if err := unix.Sethostname([]byte(h)); err != nil {
			return nil, status.Errorf(codes.Internal, "restored: setting the host name: %v", err)
		}
		if err := os.WriteFile(filepath.Join(a.Root, "etc/hostname"), []byte(h+"\n"), 0o644); err != nil {
			a.log().Warn("writing /etc/hostname", "err", err)
		}
	}
	return &pb.RestoredResponse{}, nil
}

// inVM reports whether the agent runs as a VM's agent: a child of the
// guest's init, serving the job's root filesystem.
func (a *Agent) inVM() bool { return os.Getpid() != 1 && a.Root == RootDir }

// reseed credits seed to the kernel's entropy pool (RNDADDENTROPY) and
// reseeds its generator at once (RNDRESEEDCRNG) instead of at its next
// periodic reseed.
func reseed(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+len(seed))
	binary.NativeEndian.PutUint32(buf[0:], uint32(len(seed)*8))
	binary.NativeEndian.PutUint32(buf[4:], uint32(len(seed)))
	copy(buf[8:], seed)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
		return fmt.Errorf("adding entropy: %w", errno)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); errno != 0 {
		return fmt.Errorf("reseeding: %w", errno)
	}
	return nil
}
