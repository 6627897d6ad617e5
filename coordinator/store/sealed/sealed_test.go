package sealed_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sealed"
	"github.com/berthci/berth/coordinator/store/sqlite"
	"github.com/berthci/berth/coordinator/store/storetest"
)

func open(t *testing.T) (*sqlite.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "berth.db")
	st, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, path
}

// The sealed store is a store: the whole conformance suite passes.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		st, _ := open(t)
		key, err := sealed.LoadOrCreateKey(filepath.Join(t.TempDir(), "k"))
		if err != nil {
			t.Fatal(err)
		}
		return sealed.Wrap(st, key)
	})
}

func TestValuesAreSealedAtRest(t *testing.T) {
	ctx := context.Background()
	st, dbPath := open(t)
	keyPath := filepath.Join(t.TempDir(), "secrets", "variables.key")
	key, err := sealed.LoadOrCreateKey(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(keyPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v, want mode 0600", fi, err)
	}
	p := &store.Project{Path: "p", Name: "p", Visibility: "private"}
	if err := st.CreateProject(ctx, p); err != nil {
		t.Fatal(err)
	}
	// A value stored before sealing was enabled.
	if err := st.CreateVariable(ctx, &store.Variable{ProjectID: p.ID, Key: "OLD", Value: "legacy-plain"}); err != nil {
		t.Fatal(err)
	}
	s := sealed.Wrap(st, key)
	if err := s.CreateVariable(ctx, &store.Variable{ProjectID: p.ID, Key: "TOKEN", Value: "super-secret-value", Masked: true}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Migrate(ctx); err != nil || n != 1 {
		t.Fatalf("Migrate: %d %v, want the legacy variable sealed", n, err)
	}
	raw, err := st.ListVariables(ctx, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range raw {
		if !sealed.IsSealed(v.Value) || strings.Contains(v.Value, "secret") || strings.Contains(v.Value, "legacy") {
			t.Errorf("variable %s stored as %q", v.Key, v.Value)
		}
	}
	st.Close()
	db, _ := os.ReadFile(dbPath)
	wal, _ := os.ReadFile(dbPath + "-wal")
	if strings.Contains(string(db)+string(wal), "super-secret-value") {
		t.Error("the database file holds the plain value")
	}

	st2, err := sqlite.Open(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	key2, err := sealed.LoadOrCreateKey(keyPath) // the same key, read back
	if err != nil {
		t.Fatal(err)
	}
	s2 := sealed.Wrap(st2, key2)
	v, err := s2.GetVariable(ctx, p.ID, "TOKEN")
	if err != nil || v.Value != "super-secret-value" || !v.Masked {
		t.Fatalf("GetVariable: %+v %v", v, err)
	}
	vs, err := s2.ListVariables(ctx, p.ID)
	if err != nil || len(vs) != 2 || vs[0].Value != "legacy-plain" {
		t.Fatalf("ListVariables: %+v %v", vs, err)
	}

	other, _ := sealed.LoadOrCreateKey(filepath.Join(t.TempDir(), "other"))
	if _, err := sealed.Wrap(st2, other).GetVariable(ctx, p.ID, "TOKEN"); !errors.Is(err, sealed.ErrOpen) {
		t.Errorf("another key opened the value: %v", err)
	}
	// A sealed value moved to another variable does not open.
	moved, _ := st2.GetVariable(ctx, p.ID, "TOKEN")
	if _, err := key2.Open(p.ID, "OTHER", moved.Value); !errors.Is(err, sealed.ErrOpen) {
		t.Errorf("a value moved to another key opened: %v", err)
	}
}

func TestBadKeyFile(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"short": "abcd\n", "nothex": strings.Repeat("zz", 32)} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o600)
		if _, err := sealed.LoadOrCreateKey(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
	}
}

// A subkey is the same from the same key file and purpose, and differs
// with either; it is never the key itself.
func TestSubkey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k")
	key, err := sealed.LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	again, err := sealed.LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	other, err := sealed.LoadOrCreateKey(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	a := key.Subkey("purpose a v1")
	if len(a) != sealed.KeySize {
		t.Fatalf("subkey of %d bytes, want %d", len(a), sealed.KeySize)
	}
	if !bytes.Equal(a, again.Subkey("purpose a v1")) {
		t.Error("the same key file and purpose derived another subkey")
	}
	if bytes.Equal(a, key.Subkey("purpose b v1")) || bytes.Equal(a, other.Subkey("purpose a v1")) {
		t.Error("another purpose or another key derived the same subkey")
	}
	raw, _ := os.ReadFile(path)
	if strings.Contains(string(raw), hex.EncodeToString(a)) {
		t.Error("the subkey is the key itself")
	}
}

func TestScheduleVariablesAreSealedAtRest(t *testing.T) {
	ctx := context.Background()
	st, _ := open(t)
	key, err := sealed.LoadOrCreateKey(filepath.Join(t.TempDir(), "variables.key"))
	if err != nil {
		t.Fatal(err)
	}
	s := sealed.Wrap(st, key)
	p := &store.Project{Path: "p", Name: "p", Visibility: "private"}
	if err := s.CreateProject(ctx, p); err != nil {
		t.Fatal(err)
	}
	ps := &store.PipelineSchedule{ProjectID: p.ID, Description: "nightly", Ref: "main", Cron: "@daily", CronTimezone: "UTC", Active: true,
		NextRunAt: time.Unix(100, 0), Variables: []store.PipelineVariable{{Key: "DEPLOY_TOKEN", Value: "super-secret-value"}}}
	if err := s.CreatePipelineSchedule(ctx, ps); err != nil {
		t.Fatal(err)
	}
	if ps.ID == 0 || ps.Variables[0].Value != "super-secret-value" {
		t.Fatalf("after create: ID %d, value %q (the caller's schedule must keep its plain value)", ps.ID, ps.Variables[0].Value)
	}
	ps.Variables = append(ps.Variables, store.PipelineVariable{Key: "MORE", Value: "another-secret"})
	if err := s.UpdatePipelineSchedule(ctx, ps); err != nil || ps.Version != 2 {
		t.Fatalf("update: %v, version %d", err, ps.Version)
	}
	raw, err := st.GetPipelineSchedule(ctx, ps.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range raw.Variables {
		if !sealed.IsSealed(v.Value) || strings.Contains(v.Value, "secret") {
			t.Errorf("schedule variable %s stored as %q", v.Key, v.Value)
		}
	}
	for name, get := range map[string]func() ([]*store.PipelineSchedule, error){
		"Get": func() ([]*store.PipelineSchedule, error) {
			g, err := s.GetPipelineSchedule(ctx, ps.ID)
			return []*store.PipelineSchedule{g}, err
		},
		"List": func() ([]*store.PipelineSchedule, error) { return s.ListPipelineSchedules(ctx, p.ID) },
		"Due":  func() ([]*store.PipelineSchedule, error) { return s.DuePipelineSchedules(ctx, time.Unix(200, 0), 10) },
	} {
		got, err := get()
		if err != nil || len(got) != 1 || len(got[0].Variables) != 2 || got[0].Variables[0].Value != "super-secret-value" || got[0].Variables[1].Value != "another-secret" {
			t.Errorf("%s: %+v %v", name, got, err)
		}
	}
	// A schedule's sealed value does not open as a project variable's.
	if _, err := key.Open(p.ID, "DEPLOY_TOKEN", raw.Variables[0].Value); !errors.Is(err, sealed.ErrOpen) {
		t.Errorf("a schedule variable opened as a project variable: %v", err)
	}
}
