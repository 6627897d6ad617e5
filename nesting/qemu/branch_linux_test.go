package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthci/berth/nesting"
)

// TestBranch: a running VM (restored from its template) is branched
// while a process runs in it; it runs on, and two VMs made from the
// branch point resume with its files and process, each with a disk and a
// host name of its own; what one writes the other does not see, nor what
// the branched VM writes after the branch. max_branches bounds the
// branch points, DropBranch and Shutdown remove them.
func TestBranch(t *testing.T) {
	imageDir := needBoot(t)
	state := stateDir(t)
	h := initHV(t, bootConfig(state, imageDir, `"max_branches": 1`))
	ctx := context.Background()
	v, err := h.Create(ctx, testImage)
	if err != nil {
		t.Fatal(err)
	}
	c := agent(t, v)
	if out, err := run(t, c, `mkdir -p /builds/p && echo prefix > /builds/p/file && (setsid sleep 31337 </dev/null >/dev/null 2>&1 &) && sync
for i in $(seq 50); do for f in /proc/[0-9]*/cmdline; do case "$(tr '\0' ' ' < $f)" in "sleep 31337"*) exit 0;; esac; done; sleep 0.1; done; exit 1`); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	bid, err := h.Branch(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Branch(ctx, v.ID); !errors.Is(err, ErrTooManyBranches) {
		t.Errorf("a second branch point with max_branches 1: %v, want ErrTooManyBranches", err)
	}
	// The branched VM runs on; what it writes now is its own.
	if out, err := run(t, c, "echo after > /builds/p/original && cat /builds/p/file"); err != nil || strings.TrimSpace(out) != "prefix" {
		t.Fatalf("the branched VM after the branch: %q, %v", out, err)
	}
	var branches []nesting.VirtualMachine
	for i := range 2 {
		b, err := h.CreateFromBranch(ctx, bid)
		if err != nil {
			t.Fatalf("VM %d from the branch point: %v", i, err)
		}
		if b.Name != testImage || b.ID == v.ID {
			t.Errorf("VM from the branch point: %+v", b)
		}
		branches = append(branches, b)
	}
	names := map[string]bool{v.ID: true}
	for i, b := range branches {
		bc := agent(t, b)
		out, err := run(t, bc, `cat /builds/p/file; ls /builds/p; for f in /proc/[0-9]*/cmdline; do case "$(tr '\0' ' ' < $f)" in "sleep 31337"*) echo still-running;; esac; done; echo mine-`+string(rune('a'+i))+` > /builds/p/mine`)
		if err != nil {
			t.Fatalf("in VM %d: %v: %s", i, err, out)
		}
		if !strings.Contains(out, "prefix") || !strings.Contains(out, "still-running") || strings.Contains(out, "original") {
			t.Errorf("VM %d from the branch point: %q", i, out)
		}
		hn, err := run(t, bc, "hostname")
		host := strings.TrimSpace(hn)
		if err != nil || host != b.ID || names[host] {
			t.Errorf("VM %d's host name %q (%v), want its own id %s", i, host, err, b.ID)
		}
		names[host] = true
	}
	// Each disk is its own.
	for i, b := range branches {
		out, err := run(t, agent(t, b), "cat /builds/p/mine")
		if want := "mine-" + string(rune('a'+i)); err != nil || strings.TrimSpace(out) != want {
			t.Errorf("VM %d's own file: %q, %v, want %s", i, out, err, want)
		}
	}
	if err := h.DropBranch(ctx, bid); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(state, branchesDir, bid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dropped branch point's directory: %v", err)
	}
	// VMs made from it run on.
	if out, err := run(t, agent(t, branches[0]), "cat /builds/p/file"); err != nil || strings.TrimSpace(out) != "prefix" {
		t.Errorf("a VM of a dropped branch point: %q, %v", out, err)
	}
	if _, err := h.CreateFromBranch(ctx, bid); !errors.Is(err, nesting.ErrNotFound) {
		t.Errorf("a VM from a dropped branch point: %v, want ErrNotFound", err)
	}
	if err := h.DropBranch(ctx, bid); !errors.Is(err, nesting.ErrNotFound) {
		t.Errorf("dropping it again: %v, want ErrNotFound", err)
	}
	// Shutdown removes the branch points left.
	if _, err := h.Branch(ctx, branches[1].ID); err != nil {
		t.Fatal(err)
	}
	if err := h.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(state, branchesDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("branch points after Shutdown: %v", err)
	}
}
