package config

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// machineIDFiles are read in this order, as gitlab-runner's machineid
// library does on Linux.
var machineIDFiles = []string{"/var/lib/dbus/machine-id", "/etc/machine-id"}

// SystemIDFile is the name of the file beside config.toml.
const SystemIDFile = ".runner_system_id"

// LoadOrCreateSystemID returns the system_id kept in .runner_system_id
// beside configPath, creating the file when it is missing or invalid.
func LoadOrCreateSystemID(configPath string) (string, error) {
	p := systemIDPath(configPath)
	if b, err := os.ReadFile(p); err == nil {
		if id := strings.TrimSpace(string(b)); ValidSystemID(id) {
			return id, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("reading system id: %w", err)
	}
	id := NewSystemID(readMachineID())
	if err := WriteFileAtomic(p, []byte(id), 0o600); err != nil {
		return "", fmt.Errorf("saving system id: %w", err)
	}
	return id, nil
}

// NewSystemID computes a system_id as GitLab does: "s_" + the first 12 hex
// digits of HMAC-SHA256(key machine-id, message "gitlab-runner") when a
// machine id is known, else "r_" + 12 random alphanumerics.
func NewSystemID(machineID string) string {
	if machineID != "" {
		mac := hmac.New(sha256.New, []byte(machineID))
		mac.Write([]byte("gitlab-runner"))
		return "s_" + hex.EncodeToString(mac.Sum(nil))[:12]
	}
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, 12)
	rnd := make([]byte, 12)
	_, _ = rand.Read(rnd)
	for i := range b {
		b[i] = alnum[int(rnd[i])%len(alnum)]
	}
	return "r_" + string(b)
}

// ValidSystemID reports whether id has the s_/r_ form.
func ValidSystemID(id string) bool {
	if len(id) != 14 || (id[:2] != "s_" && id[:2] != "r_") {
		return false
	}
	for _, c := range id[2:] {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func readMachineID() string {
	for _, f := range machineIDFiles {
		if b, err := os.ReadFile(f); err == nil {
			if id := strings.TrimSpace(string(b)); id != "" {
				return id
			}
		}
	}
	return ""
}
