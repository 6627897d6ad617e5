package local

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// netnsName names an instance's namespace; the hash keeps names (and the
// veth names derived from them, at most 15 bytes) unique across state
// directories.
func netnsName(stateDir, id string) string {
	sum := sha256.Sum256([]byte(stateDir + "\x00" + id))
	return "bth" + hex.EncodeToString(sum[:4])
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setupNetns creates (or recreates) the instance's namespace with a veth
// pair: <ns>h on the host with HostIP/30, <ns>i inside with IP/30, and
// loopback up.
func setupNetns(in *instance) error {
	ns := in.NetNS
	if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
		deleteNetns(ns)
	}
	// A leftover host side from an earlier run would block the new pair.
	exec.Command("ip", "link", "del", ns+"h").Run()
	steps := [][]string{
		{"netns", "add", ns},
		{"link", "add", ns + "h", "type", "veth", "peer", "name", ns + "i"},
		{"link", "set", ns + "i", "netns", ns},
		{"addr", "add", in.HostIP + "/30", "dev", ns + "h"},
		{"link", "set", ns + "h", "up"},
		{"-n", ns, "addr", "add", in.IP + "/30", "dev", ns + "i"},
		{"-n", ns, "link", "set", ns + "i", "up"},
		{"-n", ns, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			deleteNetns(ns)
			return err
		}
	}
	return nil
}

// deleteNetns removes the namespace (and with it the veth pair).
func deleteNetns(ns string) error {
	if _, err := os.Stat(filepath.Join("/run/netns", ns)); os.IsNotExist(err) {
		exec.Command("ip", "link", "del", ns+"h").Run()
		return nil
	}
	return ip("netns", "del", ns)
}
