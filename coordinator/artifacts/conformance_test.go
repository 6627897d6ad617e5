package artifacts_test

import (
	"testing"

	"github.com/berthci/berth/coordinator/artifacts"
	"github.com/berthci/berth/coordinator/artifacts/artifactstest"
)

func TestDirConformance(t *testing.T) {
	artifactstest.Run(t, func(t *testing.T) artifacts.Storage {
		d, err := artifacts.NewDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}
