// Package sealed encrypts project CI/CD variable values, and those of
// pipeline schedules, at rest. Wrap returns a store.Store whose variable
// and schedule methods seal values with AES-256-GCM before they reach the underlying store and open them when
// read, so a copy of the database alone reveals no secret. The key lives
// apart from the database (a file of its own, see LoadOrCreateKey);
// losing it loses the variables' values, not the rest of the data.
//
// A sealed value is "sealed:v1:" + base64(nonce ‖ ciphertext), with the
// project id and key name as additional data, so a value copied to
// another variable or project does not open. Values stored before
// sealing was enabled are read as they are and sealed by Migrate.
package sealed

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/berthci/berth/coordinator/store"
)

// prefix marks a sealed value.
const prefix = "sealed:v1:"

// KeySize is the key length in bytes (AES-256).
const KeySize = 32

// ErrOpen is a sealed value that does not open with the key (another
// key, or a corrupted value).
var ErrOpen = errors.New("sealed value does not open with this key")

// Key seals and opens values.
type Key struct {
	aead cipher.AEAD
	raw  []byte // for Subkey
}

// NewKey returns a Key from KeySize bytes.
func NewKey(raw []byte) (*Key, error) {
	if len(raw) != KeySize {
		return nil, fmt.Errorf("sealing key: want %d bytes, got %d", KeySize, len(raw))
	}
	block, err := aes.NewCipher(raw)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Key{aead: aead, raw: bytes.Clone(raw)}, nil
}

// Subkey derives a KeySize-byte key for a use other than sealing
// variables (HKDF-SHA256 with purpose as its info), so that one file
// keeps all the coordinator's secrets at rest while what each use
// encrypts never opens as another's. Each purpose names a use and the
// version of its format.
func (k *Key) Subkey(purpose string) []byte {
	sub, err := hkdf.Key(sha256.New, k.raw, nil, purpose, KeySize)
	if err != nil {
		// Only a length HKDF cannot give, and KeySize is not one.
		panic("sealed: deriving a subkey: " + err.Error())
	}
	return sub
}

// LoadOrCreateKey reads the hex key in path, or creates the file (0600,
// parent 0700) with a fresh random key when it does not exist.
func LoadOrCreateKey(path string) (*Key, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		raw := make([]byte, KeySize)
		if _, err := rand.Read(raw); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("creating sealing key: %w", err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("creating sealing key: %w", err)
		}
		_, werr := f.WriteString(hex.EncodeToString(raw) + "\n")
		if werr == nil {
			werr = f.Sync()
		}
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			os.Remove(path)
			return nil, fmt.Errorf("creating sealing key: %w", werr)
		}
		return NewKey(raw)
	}
	if err != nil {
		return nil, fmt.Errorf("reading sealing key: %w", err)
	}
	raw, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("sealing key %s: not hex: %w", path, err)
	}
	k, err := NewKey(raw)
	if err != nil {
		return nil, fmt.Errorf("sealing key %s: %w", path, err)
	}
	return k, nil
}

func aad(projectID int64, key string) []byte {
	return []byte(strconv.FormatInt(projectID, 10) + "\x00" + key)
}

// Seal returns the sealed form of a variable's value.
func (k *Key) Seal(projectID int64, key, value string) string {
	nonce := make([]byte, k.aead.NonceSize())
	_, _ = rand.Read(nonce)
	ct := k.aead.Seal(nonce, nonce, []byte(value), aad(projectID, key))
	return prefix + base64.RawStdEncoding.EncodeToString(ct)
}

// Open returns the value of a sealed one; a value that is not sealed is
// returned as it is.
func (k *Key) Open(projectID int64, key, stored string) (string, error) {
	rest, ok := strings.CutPrefix(stored, prefix)
	if !ok {
		return stored, nil
	}
	b, err := base64.RawStdEncoding.DecodeString(rest)
	n := k.aead.NonceSize()
	if err != nil || len(b) < n {
		return "", fmt.Errorf("variable %s of project %d: %w", key, projectID, ErrOpen)
	}
	plain, err := k.aead.Open(nil, b[:n], b[n:], aad(projectID, key))
	if err != nil {
		return "", fmt.Errorf("variable %s of project %d: %w", key, projectID, ErrOpen)
	}
	return string(plain), nil
}

// IsSealed reports whether a stored value is sealed.
func IsSealed(stored string) bool { return strings.HasPrefix(stored, prefix) }

// Store is a store.Store whose variable values are sealed at rest.
type Store struct {
	store.Store
	key *Key
}

// Wrap returns st with sealed variables.
func Wrap(st store.Store, key *Key) *Store { return &Store{Store: st, key: key} }

func (s *Store) sealed(v *store.Variable) *store.Variable {
	c := *v
	c.Value = s.key.Seal(v.ProjectID, v.Key, v.Value)
	return &c
}

func (s *Store) open(v *store.Variable) (*store.Variable, error) {
	val, err := s.key.Open(v.ProjectID, v.Key, v.Value)
	if err != nil {
		return nil, err
	}
	v.Value = val
	return v, nil
}

// CreateVariable implements store.Store.
func (s *Store) CreateVariable(ctx context.Context, v *store.Variable) error {
	if v == nil {
		return s.Store.CreateVariable(ctx, v)
	}
	return s.Store.CreateVariable(ctx, s.sealed(v))
}

// UpdateVariable implements store.Store.
func (s *Store) UpdateVariable(ctx context.Context, v *store.Variable) error {
	if v == nil {
		return s.Store.UpdateVariable(ctx, v)
	}
	return s.Store.UpdateVariable(ctx, s.sealed(v))
}

// GetVariable implements store.Store.
func (s *Store) GetVariable(ctx context.Context, projectID int64, key string) (*store.Variable, error) {
	v, err := s.Store.GetVariable(ctx, projectID, key)
	if err != nil {
		return nil, err
	}
	return s.open(v)
}

// ListVariables implements store.Store.
func (s *Store) ListVariables(ctx context.Context, projectID int64) ([]*store.Variable, error) {
	vs, err := s.Store.ListVariables(ctx, projectID)
	if err != nil {
		return nil, err
	}
	for _, v := range vs {
		if _, err := s.open(v); err != nil {
			return nil, err
		}
	}
	return vs, nil
}

// Migrate seals every variable still stored in plain text (written before
// sealing was enabled) and returns how many it sealed.
func (s *Store) Migrate(ctx context.Context) (int, error) {
	ps, err := s.Store.ListProjects(ctx)
	if err != nil {
		return 0, fmt.Errorf("sealing variables: %w", err)
	}
	n := 0
	for _, p := range ps {
		vs, err := s.Store.ListVariables(ctx, p.ID)
		if err != nil {
			return n, fmt.Errorf("sealing variables of project %d: %w", p.ID, err)
		}
		for _, v := range vs {
			if IsSealed(v.Value) {
				continue
			}
			if err := s.Store.UpdateVariable(ctx, s.sealed(v)); err != nil {
				return n, fmt.Errorf("sealing variable %s of project %d: %w", v.Key, p.ID, err)
			}
			n++
		}
	}
	return n, nil
}

// scheduleKey is the name a pipeline schedule's variable is sealed under:
// apart from the project's variables, so a value cannot be moved between
// the two.
func scheduleKey(key string) string { return "pipeline_schedule\x00" + key }

func (s *Store) sealedSchedule(ps *store.PipelineSchedule) *store.PipelineSchedule {
	if ps == nil || len(ps.Variables) == 0 {
		return ps
	}
	c := *ps
	c.Variables = make([]store.PipelineVariable, len(ps.Variables))
	for i, v := range ps.Variables {
		v.Value = s.key.Seal(ps.ProjectID, scheduleKey(v.Key), v.Value)
		c.Variables[i] = v
	}
	return &c
}

func (s *Store) openSchedules(pss ...*store.PipelineSchedule) error {
	for _, ps := range pss {
		for i, v := range ps.Variables {
			val, err := s.key.Open(ps.ProjectID, scheduleKey(v.Key), v.Value)
			if err != nil {
				return fmt.Errorf("pipeline schedule %d: %w", ps.ID, err)
			}
			ps.Variables[i].Value = val
		}
	}
	return nil
}

// CreatePipelineSchedule implements store.Store: variable values are
// sealed.
func (s *Store) CreatePipelineSchedule(ctx context.Context, ps *store.PipelineSchedule) error {
	c := s.sealedSchedule(ps)
	err := s.Store.CreatePipelineSchedule(ctx, c)
	if c != ps {
		ps.ID, ps.Version = c.ID, c.Version
	}
	return err
}

// UpdatePipelineSchedule implements store.Store.
func (s *Store) UpdatePipelineSchedule(ctx context.Context, ps *store.PipelineSchedule) error {
	c := s.sealedSchedule(ps)
	err := s.Store.UpdatePipelineSchedule(ctx, c)
	if c != ps {
		ps.Version = c.Version
	}
	return err
}

// GetPipelineSchedule implements store.Store.
func (s *Store) GetPipelineSchedule(ctx context.Context, id int64) (*store.PipelineSchedule, error) {
	ps, err := s.Store.GetPipelineSchedule(ctx, id)
	if err != nil {
		return nil, err
	}
	return ps, s.openSchedules(ps)
}

// ListPipelineSchedules implements store.Store.
func (s *Store) ListPipelineSchedules(ctx context.Context, projectID int64) ([]*store.PipelineSchedule, error) {
	pss, err := s.Store.ListPipelineSchedules(ctx, projectID)
	if err != nil {
		return nil, err
	}
	return pss, s.openSchedules(pss...)
}

// DuePipelineSchedules implements store.Store.
func (s *Store) DuePipelineSchedules(ctx context.Context, t time.Time, limit int) ([]*store.PipelineSchedule, error) {
	pss, err := s.Store.DuePipelineSchedules(ctx, t, limit)
	if err != nil {
		return nil, err
	}
	return pss, s.openSchedules(pss...)
}
