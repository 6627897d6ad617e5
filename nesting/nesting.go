// Package nesting is the VM-per-slot daemon of an instance and its client,
// speaking GitLab's nesting gRPC API unchanged (service nesting.Nesting:
// Init, Create with an optional slot, Delete, List, Shutdown; see
// reference/gitlab-next.md §3), so that GitLab Runner can drive a Berth
// daemon and Berth's runner can drive GitLab's.
//
//	runner ──Client══ gRPC (unix socket, often through SSH) ══► Server ──► Hypervisor ──► VMs
//
// The daemon's behaviour lives in Server: the initialized flag, the slot →
// VM bookkeeping and stomping, the error contract on the wire. A Hypervisor
// only creates and destroys VMs; hypervisors live in their own packages
// (nesting/qemu) and are wired in cmd/berth. The conformance suite every
// hypervisor passes is nesting/nestingtest.
package nesting

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
)

// Hypervisor creates and destroys VMs for a nesting daemon. Safe for
// concurrent use.
//
// Lifecycle, as the Server drives it:
//
//	        Init ok
//	new ────────────► initialized ──Create/Delete/List──┐
//	 ▲ │ Init error        │   ▲                        │
//	 │ └───(stays new)     │   └────────────────────────┘
//	 │                     │ Shutdown
//	 └─────────────────────┘  (stops every VM; Init may follow again)
//
// The Server calls Create, Delete and List only between a successful Init
// and the next Shutdown, and Init never twice without a Shutdown in between.
// Shutdown may come at any time: before Init, twice, or while Creates are in
// flight (the daemon calls it when it exits); it must be safe then. Every
// method honours ctx and returns an error wrapping ctx.Err() when it ends
// early, leaving no half-made VM behind.
type Hypervisor interface {
	// Init configures the hypervisor from the JSON config of InitRequest
	// (GitLab Runner sends its [runners.autoscaler.vm_isolation]
	// nesting_config table as a JSON object; an empty config means the same
	// as {}). An error means the config was refused (the daemon then stays
	// uninitialized and a later Init may try again).
	Init(ctx context.Context, config []byte) error

	// Create makes and starts a VM from image name; its ID starts with
	// IDPrefix ("nesting-") followed by 8 chars of [a-z0-9] (see NewID), its
	// Name is the image name, and Addr is how to reach it (hypervisor
	// specific: the QEMU one returns a unix socket path). Create returns once
	// the VM runs and Addr is known; the guest may still be booting, so
	// callers connect with retries. A failed Create leaves no VM behind.
	Create(ctx context.Context, name string) (VirtualMachine, error)

	// Delete stops the VM and removes everything Create made for it. An
	// unknown id (never created, or already deleted) is an error wrapping
	// ErrNotFound.
	Delete(ctx context.Context, id string) error

	// List returns the VMs it runs whose ID has IDPrefix, including ones an
	// earlier process of the daemon left behind when it can find them, so
	// that a runner's clean-up (List, then Delete each) reclaims them.
	List(ctx context.Context) ([]VirtualMachine, error)

	// Shutdown stops everything it runs. Afterwards List returns nothing
	// (after a new Init) and the hypervisor may be initialized again.
	Shutdown(ctx context.Context) error
}

// Snapshotter is a Hypervisor that can save a running VM whole (memory,
// devices, disk) as a bundle another machine can restore: Berth's
// extension, used in process (the nesting protocol has no such call).
type Snapshotter interface {
	// SnapshotVM writes VM id's bundle to w; the VM pauses meanwhile and
	// then runs on.
	SnapshotVM(ctx context.Context, id string, job SnapshotJob, w io.Writer) error
}

// Brancher is a Hypervisor that can save a running VM as a branch point
// and start any number of VMs from it, each resuming where the VM was
// saved with a copy-on-write disk of its own: Berth's extension, used in
// process (the nesting protocol has no such call). Branch points live
// until DropBranch or Shutdown.
type Brancher interface {
	// Branch saves VM id (memory, devices, disk) as a new branch point
	// and returns its id; the VM pauses meanwhile and then runs on.
	Branch(ctx context.Context, id string) (string, error)
	// CreateFromBranch makes a VM resuming branch point branch, as Create
	// makes one from an image (its Name is the branched VM's image).
	CreateFromBranch(ctx context.Context, branch string) (VirtualMachine, error)
	// DropBranch removes a branch point; VMs made from it run on. An
	// unknown id wraps ErrNotFound.
	DropBranch(ctx context.Context, branch string) error
}

// BundleRestorer is a Hypervisor that can make a VM from a snapshot
// bundle (Snapshotter.SnapshotVM's stream, from this daemon or another
// with the same QEMU and accelerator): the guest resumes as it was saved,
// with a new id and host name. Berth's extension, used in process.
type BundleRestorer interface {
	// CreateFromBundle reads the bundle from r and makes a VM of it,
	// as Create makes one of an image; it returns the VM and what the
	// bundle records of its job.
	CreateFromBundle(ctx context.Context, r io.Reader) (VirtualMachine, SnapshotJob, error)
}

// SnapshotJob is what a VM snapshot records of the job it was taken in.
type SnapshotJob struct {
	ID      int64  `json:"id,omitempty"`
	Name    string `json:"name,omitempty"`
	Project string `json:"project,omitempty"`
	// Point is when it was taken (on_failure: once the script failed,
	// before after_script).
	Point string `json:"point,omitempty"`
	// Dir is the job's working directory, Shell its shell and Env its
	// environment (the image's and the job's variables; the runner leaves
	// masked ones out).
	Dir   string   `json:"dir,omitempty"`
	Shell string   `json:"shell,omitempty"`
	Env   []string `json:"env,omitempty"`
	// TmpDir and CacheDir are the job's temporary and cache directories
	// (a job resuming the snapshot uses them as its own).
	TmpDir   string `json:"tmp_dir,omitempty"`
	CacheDir string `json:"cache_dir,omitempty"`
}

// VirtualMachine is one VM of a daemon, as the wire carries it.
type VirtualMachine struct {
	ID   string `json:"id"`
	Name string `json:"name"` // the image it was created from
	Addr string `json:"addr"` // hypervisor specific: a unix socket path, host:port or an IP
}

// IDPrefix starts every VM ID. List reports only VMs whose ID has it, so a
// hypervisor shared with other tools never hands theirs out.
const IDPrefix = "nesting-"

const (
	idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	idLen      = 8
)

// NewID returns a new random VM ID: IDPrefix followed by 8 chars of
// [a-z0-9] (41 bits; a daemon runs a handful of VMs).
func NewID() string {
	b := make([]byte, 0, len(IDPrefix)+idLen)
	b = append(b, IDPrefix...)
	var buf [2 * idLen]byte
	for len(b) < cap(b) {
		rand.Read(buf[:]) // never fails (crypto/rand since Go 1.24)
		for _, c := range buf {
			// 252 = 7·36: below it c%36 is uniform.
			if c < 252 && len(b) < cap(b) {
				b = append(b, idAlphabet[c%36])
			}
		}
	}
	return string(b)
}

// ValidID reports whether id has the shape NewID gives: IDPrefix followed by
// 8 chars of [a-z0-9].
func ValidID(id string) bool {
	if len(id) != len(IDPrefix)+idLen || id[:len(IDPrefix)] != IDPrefix {
		return false
	}
	for _, c := range []byte(id[len(IDPrefix):]) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// The errors of the contract, checked with errors.Is on both sides of the
// wire. The Server sends them as gRPC FailedPrecondition (the two
// initialization errors, with exactly these messages: upstream declares
// them as status values, which match only on equal code and message) and
// NotFound; the Client turns those codes back into them.
var (
	// ErrNotFound: Delete of an unknown VM id.
	ErrNotFound = errors.New("vm not found")
	// ErrNotInitialized: Create, Delete, List or Shutdown before a
	// successful Init (or after Shutdown).
	ErrNotInitialized = errors.New("not initialized")
	// ErrAlreadyInitialized: Init on an initialized daemon.
	ErrAlreadyInitialized = errors.New("already initialized")
)
