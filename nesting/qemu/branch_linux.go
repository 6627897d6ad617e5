package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/berthci/berth/nesting"
)

// Branch points. Branch saves a running VM as the snapshot of a job does
// (memory and devices by migration, the VM paused meanwhile and running
// on afterwards), but keeps it on this machine: its disk is a copy of the
// VM's overlay, on the same backing file (the image, or a template's
// disk), not a flattened one. CreateFromBranch then makes VMs the way a
// restore from a template does — a qcow2 overlay on the branch's disk,
// QEMU loading the saved state — so each resumes, with its own host name,
// clock and entropy, exactly where the branched VM was: files, page
// cache and processes. The runner branches a parallel:matrix job's VM
// once the matrix's common prefix ran in it (docs/snapshots.md).
//
//	StateDir/branches/<id>/   state, disk.qcow2, meta.json
//
// Branch points are this daemon's alone: Shutdown removes them, and Init
// removes what an earlier daemon left. At most MaxBranches live at once.

// branchesDir holds the branch points under the state directory.
const branchesDir = "branches"

// branchPrefix starts a branch point's id.
const branchPrefix = "branch-"

// branchMeta is a branch point's meta.json.
type branchMeta struct {
	ID         string    `json:"id"`
	VM         string    `json:"vm"`
	Image      string    `json:"image"`
	BootID     string    `json:"boot_id"`
	MemBackend bool      `json:"mem_backend"`
	Made       time.Time `json:"made"`
}

// branchPoint is a branch point of this daemon.
type branchPoint struct {
	dir   string
	meta  branchMeta
	shape shape // the branched VM's
}

// saved is what a VM made from the branch point resumes.
func (b *branchPoint) saved() saved {
	return saved{shape: b.shape, image: b.meta.Image, bootID: b.meta.BootID, memBackend: b.meta.MemBackend,
		state: filepath.Join(b.dir, bundleState), disk: filepath.Join(b.dir, bundleDisk), from: []any{"branch", b.meta.ID}}
}

var _ nesting.Brancher = (*Hypervisor)(nil)

// ErrTooManyBranches is a Branch beyond max_branches.
var ErrTooManyBranches = errors.New("too many branch points (max_branches)")

// Branch implements nesting.Brancher.
func (h *Hypervisor) Branch(ctx context.Context, id string) (string, error) {
	h.mu.Lock()
	v, s := h.vms[id], h.setup
	if v == nil || s == nil {
		h.mu.Unlock()
		return "", fmt.Errorf("qemu: branching VM %q: %w", id, nesting.ErrNotFound)
	}
	if len(s.branches)+s.branching >= s.cfg.MaxBranches {
		n := s.cfg.MaxBranches
		h.mu.Unlock()
		return "", fmt.Errorf("qemu: branching VM %s: %w: %d kept", id, ErrTooManyBranches, n)
	}
	s.branching++
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		s.branching--
		h.mu.Unlock()
	}()
	began := time.Now()
	root := filepath.Join(s.cfg.StateDir, branchesDir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", fmt.Errorf("qemu: branching VM %s: %w", id, err)
	}
	bid := branchPrefix + randomSuffix()
	dir := filepath.Join(root, bid)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("qemu: branching VM %s: %w", id, err)
	}
	b := &branchPoint{dir: dir, shape: v.shape,
		meta: branchMeta{ID: bid, VM: id, Image: v.Name, BootID: v.bootID, MemBackend: v.memBackend, Made: time.Now().UTC()}}
	err := h.saveVM(ctx, s, v, dir, false)
	if err == nil {
		err = writeJSON(filepath.Join(dir, templateMeta), b.meta)
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("qemu: branching VM %s: %w", id, err)
	}
	h.mu.Lock()
	if h.setup != s {
		h.mu.Unlock()
		os.RemoveAll(dir)
		return "", fmt.Errorf("qemu: branching VM %s: %w", id, errShutdown)
	}
	s.branches[bid] = b
	h.mu.Unlock()
	h.log.Info("VM branched", "id", id, "branch", bid, "took", time.Since(began).Round(time.Millisecond))
	return bid, nil
}

// CreateFromBranch implements nesting.Brancher.
func (h *Hypervisor) CreateFromBranch(ctx context.Context, branch string) (nesting.VirtualMachine, error) {
	return h.makeVM(ctx, "from branch point "+branch, func(ctx context.Context, s *setup, id, dir string) (*vm, error) {
		h.mu.Lock()
		b := s.branches[branch]
		h.mu.Unlock()
		if b == nil {
			return nil, fmt.Errorf("no such branch point: %w", nesting.ErrNotFound)
		}
		return h.resumeVM(ctx, s, id, dir, "from a branch point", func(string) (saved, error) { return b.saved(), nil })
	})
}

// DropBranch implements nesting.Brancher.
func (h *Hypervisor) DropBranch(ctx context.Context, branch string) error {
	h.mu.Lock()
	s := h.setup
	var b *branchPoint
	if s != nil {
		b = s.branches[branch]
		delete(s.branches, branch)
	}
	h.mu.Unlock()
	if b == nil {
		return fmt.Errorf("qemu: dropping branch point %q: %w", branch, nesting.ErrNotFound)
	}
	// VMs made from it keep its files open until they end.
	if err := os.RemoveAll(b.dir); err != nil {
		return fmt.Errorf("qemu: dropping branch point %s: %w", branch, err)
	}
	h.log.Info("branch point dropped", "branch", branch)
	return nil
}

// dropBranches removes every branch point of s (Shutdown).
func dropBranches(s *setup) error {
	return os.RemoveAll(filepath.Join(s.cfg.StateDir, branchesDir))
}

// writeJSON writes v to p, indented.
func writeJSON(p string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(p, append(b, '\n'), 0o600)
}
