package nestingtest_test

import (
	"testing"
	"time"

	"github.com/berthci/berth/nesting"
	"github.com/berthci/berth/nesting/nestingtest"
)

func TestFakePassesTheSuite(t *testing.T) {
	nestingtest.Run(t, func(t *testing.T) nesting.Hypervisor { return &nestingtest.Fake{} }, "debian-12")
}

func TestFakePassesTheSuiteWithConfigAndSlowCreates(t *testing.T) {
	nestingtest.Run(t, func(t *testing.T) nesting.Hypervisor {
		return &nestingtest.Fake{CreateDelay: 5 * time.Millisecond, Addr: func(id string) string { return "/run/" + id + ".sock" }}
	}, "alpine", nestingtest.WithConfig([]byte(`{"image_directory":"/var/lib/images"}`)))
}
