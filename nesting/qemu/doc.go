// Package qemu is the QEMU hypervisor of Berth's nesting daemon
// (nesting.Hypervisor): one QEMU process per VM, on Linux, booting
// Berth's kernel and initramfs (vmimage.Store.BootFiles, with the running
// berth binary as the guest agent) with the job image's root filesystem
// (vmimage.Store) as its disk, through a qcow2 copy-on-write overlay of
// its own.
//
//	Init(config) ──► ParseConfig ─► lock StateDir ─► stop and remove an earlier daemon's VMs
//	                 ─► BootFiles (kernel + initramfs) ─► accelerator (tcg, kvm, or auto: a probe VM)
//	Create(image) ──► Build or Lookup the root filesystem ─► StateDir/vms/<id>/overlay.qcow2
//	                 ─► qemu-system-x86_64 (own process group, dies with the daemon)
//	                 ─► guest agent answers Hello on StateDir/vms/<id>/agent.sock ─► VM{ID, Name, Addr: unix://…/agent.sock}
//	Delete(id)    ──► SIGTERM, SIGKILL after 5 s ─► remove StateDir/vms/<id>/
//
// The guest's agent (`berth guest --init`, package guest) serves gRPC on
// the virtio-serial port "berth.agent", which QEMU exposes as the unix
// socket Addr names; hosts reach it with guest.NewClient. The machine is
// QEMU's microvm (virtio-mmio) by default, or q35 (a PC with virtio-pci
// devices); the network is QEMU's user-mode networking (10.0.2.15, the
// host 10.0.2.2, DNS 10.0.2.3) or none. docs/nesting.md has the config
// keys and the decisions.
package qemu
