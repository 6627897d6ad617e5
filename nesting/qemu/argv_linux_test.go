package qemu

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestArgv(t *testing.T) {
	const dir = "/var/lib/berth/nesting/vms/nesting-abc12345"
	base := vmSpec{id: "nesting-abc12345", dir: dir, cpus: 2, memoryMB: 512,
		kernel: "/boot/vmlinuz-6.1.0-56-amd64", initrd: "/cache/boot/initramfs.img", disk: dir + "/overlay.qcow2"}
	common := func(machine, accel, cpu, cmdline string) []string {
		return []string{
			"-name", "nesting-abc12345",
			"-M", machine,
			"-accel", accel,
			"-cpu", cpu,
			"-smp", "2",
			"-m", "512",
			"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
			"-serial", "file:" + dir + "/console.log",
			"-kernel", "/boot/vmlinuz-6.1.0-56-amd64",
			"-initrd", "/cache/boot/initramfs.img",
			"-append", cmdline,
			"-chardev", "socket,id=agent,path=" + dir + "/port.sock,server=on,wait=off",
		}
	}
	for _, c := range []struct {
		name string
		spec func(s *vmSpec)
		want []string
	}{
		{
			name: "microvm tcg user",
			spec: func(s *vmSpec) { s.machine, s.accel, s.network = MachineMicroVM, AccelTCG, NetworkUser },
			want: append(common("microvm,x-option-roms=off,isa-serial=on,rtc=on", "tcg", "max",
				"console=ttyS0 quiet panic=-1 reboot=t berth.hostname=nesting-abc12345 berth.network=user lpj=4000000 tsc_early_khz=2000000"),
				"-device", "virtio-serial-device",
				"-device", "virtserialport,chardev=agent,id=agentport,name=berth.agent",
				"-drive", "id=root,file="+dir+"/overlay.qcow2,format=qcow2,if=none,discard=unmap",
				"-device", "virtio-blk-device,drive=root",
				"-netdev", "user,id=net0,net=10.0.2.0/24,host=10.0.2.2,dns=10.0.2.3",
				"-device", "virtio-net-device,netdev=net0"),
		},
		{
			name: "microvm kvm none",
			spec: func(s *vmSpec) { s.machine, s.accel, s.network = MachineMicroVM, AccelKVM, NetworkNone },
			want: append(common("microvm,x-option-roms=off,isa-serial=on,rtc=on", "kvm", "host",
				"console=ttyS0 quiet panic=-1 reboot=t berth.hostname=nesting-abc12345 berth.network=none"),
				"-device", "virtio-serial-device",
				"-device", "virtserialport,chardev=agent,id=agentport,name=berth.agent",
				"-drive", "id=root,file="+dir+"/overlay.qcow2,format=qcow2,if=none,discard=unmap",
				"-device", "virtio-blk-device,drive=root"),
		},
		{
			name: "q35 tcg user",
			spec: func(s *vmSpec) { s.machine, s.accel, s.network = MachineQ35, AccelTCG, NetworkUser },
			want: append(common("q35", "tcg", "max",
				"console=ttyS0 quiet panic=-1 reboot=t berth.hostname=nesting-abc12345 berth.network=user lpj=4000000 tsc_early_khz=2000000"),
				"-device", "virtio-serial-pci",
				"-device", "virtserialport,chardev=agent,id=agentport,name=berth.agent",
				"-drive", "id=root,file="+dir+"/overlay.qcow2,format=qcow2,if=none,discard=unmap",
				"-device", "virtio-blk-pci,drive=root",
				"-netdev", "user,id=net0,net=10.0.2.0/24,host=10.0.2.2,dns=10.0.2.3",
				"-device", "virtio-net-pci,netdev=net0,romfile="),
		},
		{
			name: "q35 kvm none, no disk (the probe)",
			spec: func(s *vmSpec) { s.machine, s.accel, s.network, s.disk = MachineQ35, AccelKVM, NetworkNone, "" },
			want: append(common("q35", "kvm", "host",
				"console=ttyS0 quiet panic=-1 reboot=t berth.hostname=nesting-abc12345 berth.network=none"),
				"-device", "virtio-serial-pci",
				"-device", "virtserialport,chardev=agent,id=agentport,name=berth.agent"),
		},
		{
			name: "template: shared memory file, QMP",
			spec: func(s *vmSpec) {
				s.machine, s.accel, s.network = MachineMicroVM, AccelTCG, NetworkNone
				s.memFile, s.memShared, s.qmp = dir+"/ram", true, dir+"/qmp.sock"
			},
			want: append(common("microvm,x-option-roms=off,isa-serial=on,rtc=on,memory-backend=mem", "tcg", "max",
				"console=ttyS0 quiet panic=-1 reboot=t berth.hostname=nesting-abc12345 berth.network=none lpj=4000000 tsc_early_khz=2000000"),
				"-device", "virtio-serial-device",
				"-device", "virtserialport,chardev=agent,id=agentport,name=berth.agent",
				"-drive", "id=root,file="+dir+"/overlay.qcow2,format=qcow2,if=none,discard=unmap",
				"-device", "virtio-blk-device,drive=root",
				"-object", "memory-backend-file,id=mem,size=512M,mem-path="+dir+"/ram,share=on",
				"-qmp", "unix:"+dir+"/qmp.sock,server=on,wait=off"),
		},
		{
			name: "restored: the template's command line, private memory, incoming",
			spec: func(s *vmSpec) {
				s.machine, s.accel, s.network = MachineQ35, AccelKVM, NetworkNone
				s.bootID, s.memFile, s.qmp, s.incoming = "nesting-template", "/t/ram", dir+"/qmp.sock", "/t/state"
			},
			want: append(common("q35,memory-backend=mem", "kvm", "host",
				"console=ttyS0 quiet panic=-1 reboot=t berth.hostname=nesting-template berth.network=none"),
				"-device", "virtio-serial-pci",
				"-device", "virtserialport,chardev=agent,id=agentport,name=berth.agent",
				"-drive", "id=root,file="+dir+"/overlay.qcow2,format=qcow2,if=none,discard=unmap",
				"-device", "virtio-blk-pci,drive=root",
				"-object", "memory-backend-file,id=mem,size=512M,mem-path=/t/ram,share=off",
				"-qmp", "unix:"+dir+"/qmp.sock,server=on,wait=off",
				"-incoming", "defer"),
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := base
			c.spec(&s)
			got := argv(s)
			if !slices.Equal(got, c.want) {
				t.Errorf("argv:\n got %s\nwant %s", strings.Join(got, " "), strings.Join(c.want, " "))
			}
			// Whatever the machine, cleanup recognizes the VM's QEMU by it.
			if d, ok := vmDirOf(append([]string{"qemu-system-x86_64"}, got...), "/var/lib/berth/nesting/vms"); !ok || d != dir {
				t.Errorf("vmDirOf(argv) = %q %v, want %s", d, ok, dir)
			}
		})
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"/var/lib/x/state": `'/var/lib/x/state'`,
		"/a b/it's":        `'/a b/it'\''s'`,
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
		if out, err := exec.Command("/bin/sh", "-c", "printf %s "+shellQuote(in)).Output(); err != nil || string(out) != in {
			t.Errorf("sh reads %s as %q, %v", shellQuote(in), out, err)
		}
	}
}
