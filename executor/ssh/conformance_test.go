package ssh

import (
	"testing"

	"github.com/berthci/berth/executor"
	"github.com/berthci/berth/executor/executortest"
)

func TestConformance(t *testing.T) {
	needSSHD(t)
	executortest.Run(t, executortest.Config{
		NewProvider: func(t *testing.T, dir string) executor.Provider {
			return newProvider(t, testOptions(dir))
		},
	})
}
