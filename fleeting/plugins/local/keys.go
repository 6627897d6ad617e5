package local

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"

	"golang.org/x/crypto/ssh"
)

// loadOrCreateKey returns the ed25519 private key in PEM at path, creating
// it first if it does not exist.
func loadOrCreateKey(path string) ([]byte, ssh.Signer, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		block, err := ssh.MarshalPrivateKey(priv, "berth fleeting local")
		if err != nil {
			return nil, nil, err
		}
		b = pem.EncodeToMemory(block)
		if err := writeFileAtomic(path, b, 0o600); err != nil {
			return nil, nil, err
		}
	} else if err != nil {
		return nil, nil, err
	}
	signer, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, nil, fmt.Errorf("key %s: %w", path, err)
	}
	return b, signer, nil
}

// writeFileAtomic replaces path with data.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
