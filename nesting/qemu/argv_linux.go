package qemu

import (
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berthci/berth/guest"
)

// vmSpec is one QEMU process to start.
type vmSpec struct {
	id       string
	dir      string // absolute
	machine  string // MachineMicroVM or MachineQ35
	accel    string // AccelKVM or AccelTCG
	cpus     int
	memoryMB int
	network  string // NetworkUser or NetworkNone
	kernel   string
	initrd   string
	// disk is the root disk's qcow2 overlay; "" boots without a disk (the
	// KVM probe).
	disk string
	// bootID is the host name on the kernel's command line when it is not
	// id: a VM restored from a template keeps the template's command line
	// (the guest gets its own name from the agent's Restored).
	bootID string
	// memFile, when set, is the guest's memory as a file: shared (the
	// template's VM writes its memory there, to be snapshotted) or private
	// (a VM restored from the template maps it copy-on-write, so its
	// memory is loaded lazily and shared with its siblings until written).
	memFile   string
	memShared bool
	// memRAM gives the guest's memory as an anonymous memory backend
	// named like memFile's: a VM restored from a snapshot of a VM that had
	// memFile.
	memRAM bool
	// qmp is the path of a QMP socket QEMU listens on ("": none).
	qmp string
	// incoming is the device state to restore the VM from; QMP (qmp)
	// starts the restore. ignoreShared when it was saved without the
	// memory (a template's snapshot, made with x-ignore-shared: the memory
	// is memFile's).
	incoming     string
	ignoreShared bool
}

// tcgCmdline are kernel arguments for TCG: without a preset loops-per-
// jiffy and early TSC frequency the guest's timer calibration can hang on
// a busy host, where emulated time runs unevenly.
const tcgCmdline = "lpj=4000000 tsc_early_khz=2000000"

// kernelCmdline is the guest kernel's command line. console=ttyS0 is the
// serial console (console.log); panic=-1 reboots at once on a panic (an
// agent that dies as PID 1) and reboot=t reboots through the triple
// fault, which -no-reboot turns into QEMU exiting. berth.hostname and
// berth.network are read by the agent.
func kernelCmdline(s vmSpec) string {
	host := s.id
	if s.bootID != "" {
		host = s.bootID
	}
	args := []string{"console=ttyS0", "quiet", "panic=-1", "reboot=t",
		guest.ParamHostname + "=" + host, guest.ParamNetwork + "=" + s.network}
	if s.accel == AccelTCG {
		args = append(args, tcgCmdline)
	}
	return strings.Join(args, " ")
}

// argv is QEMU's command line (without the program) for s.
//
// microvm: `-M microvm,x-option-roms=off,isa-serial=on,rtc=on` with
// virtio-mmio devices (virtio-*-device); ACPI stays on, because Debian's
// kernel finds virtio-mmio devices only through the ACPI tables (it
// ignores virtio_mmio.device= arguments). q35: a PC with firmware and
// virtio-pci devices (the guest loads virtio_pci), still booted directly
// with -kernel and -initrd. Both: no default devices, no user config
// files, no display, no reboot (a reboot or panic ends QEMU), the serial
// console to console.log, the agent's port as a unix socket QEMU listens
// on, the root disk through its qcow2 overlay, and the network.
func argv(s vmSpec) []string {
	dev := func(kind string) string { return "virtio-" + kind + "-device" }
	machine := "microvm,x-option-roms=off,isa-serial=on,rtc=on"
	if s.machine == MachineQ35 {
		dev = func(kind string) string { return "virtio-" + kind + "-pci" }
		machine = "q35"
	}
	if s.memFile != "" || s.memRAM {
		machine += ",memory-backend=mem"
	}
	cpu := "max"
	if s.accel == AccelKVM {
		cpu = "host"
	}
	a := []string{
		"-name", s.id,
		"-M", machine,
		"-accel", s.accel,
		"-cpu", cpu,
		"-smp", strconv.Itoa(s.cpus),
		"-m", strconv.Itoa(s.memoryMB),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-serial", "file:" + filepath.Join(s.dir, consoleFile),
		"-kernel", s.kernel,
		"-initrd", s.initrd,
		"-append", kernelCmdline(s),
		"-chardev", agentChardev(s.dir),
		"-device", dev("serial"),
		// The id makes QEMU report the guest opening and closing the
		// port (VSERPORT_CHANGE), which a template's snapshot waits for.
		"-device", "virtserialport,chardev=agent,id=" + agentPortID + ",name=" + guest.PortName,
	}
	if s.disk != "" {
		a = append(a,
			"-drive", "id=root,file="+s.disk+",format=qcow2,if=none,discard=unmap",
			"-device", dev("blk")+",drive=root")
	}
	if s.memFile != "" {
		share := "off"
		if s.memShared {
			share = "on"
		}
		a = append(a, "-object", "memory-backend-file,id=mem,size="+strconv.Itoa(s.memoryMB)+"M,mem-path="+s.memFile+",share="+share)
	} else if s.memRAM {
		a = append(a, "-object", "memory-backend-ram,id=mem,size="+strconv.Itoa(s.memoryMB)+"M")
	}
	if s.qmp != "" {
		a = append(a, "-qmp", "unix:"+s.qmp+",server=on,wait=off")
	}
	if s.incoming != "" {
		// The state comes once QMP set x-ignore-shared (incoming).
		a = append(a, "-incoming", "defer")
	}
	if s.network == NetworkUser {
		nic := dev("net") + ",netdev=net0"
		if s.machine == MachineQ35 {
			// No boot ROM: the kernel is booted directly, never from
			// the network (and the ROM files need not be installed).
			nic += ",romfile="
		}
		a = append(a,
			"-netdev", "user,id=net0,net=10.0.2.0/24,host=10.0.2.2,dns=10.0.2.3",
			"-device", nic)
	}
	return a
}

// agentPortID is the id of the agent's virtio-serial port device.
const agentPortID = "agentport"

// agentChardevPrefix starts the -chardev argument of every VM's agent
// port; with the VM directory it identifies a VM's QEMU among all
// processes (cleanup of an earlier daemon's VMs).
const agentChardevPrefix = "socket,id=agent,path="

func agentChardev(dir string) string {
	return agentChardevPrefix + portPath(dir) + ",server=on,wait=off"
}

// shellQuote quotes p for /bin/sh (QEMU runs exec: migration URIs with
// it).
func shellQuote(p string) string { return "'" + strings.ReplaceAll(p, "'", `'\''`) + "'" }
