package sqlite_test

import (
	"testing"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/coordinator/store/storetest"
)

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, func(b *testing.B) store.Store { return openTemp(b) })
}
