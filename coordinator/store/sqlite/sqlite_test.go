package sqlite_test

import (
	"path/filepath"
	"testing"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/sqlite"
	"github.com/berthci/berth/coordinator/store/storetest"
)

func openTemp(t testing.TB) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "berth.db"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return openTemp(t) })
}
