package snapshots

import (
	"strings"
	"testing"
)

func TestSnapshotTypes(t *testing.T) {
	for _, tt := range []struct {
		typ      string
		snapshot bool
		refused  bool
	}{
		{"berth_snapshot", true, false},
		{"berth_snapshot_get_sources", true, false},
		{"berth_snapshot_before_script", true, false},
		{"berth_snapshot_end", true, false},
		{"berth_snapshot_foo", false, true},
		{"berth_snapshot_", false, true},
		{"berth_snapshot_end_", false, true},
		{"archive", false, false},
		{"berth_snapshots", false, false},
	} {
		if got := IsSnapshotType(tt.typ); got != tt.snapshot {
			t.Errorf("IsSnapshotType(%q) = %v, want %v", tt.typ, got, tt.snapshot)
		}
		err := CheckType(tt.typ)
		if (err != nil) != tt.refused || err != nil && !strings.Contains(err.Error(), `"`+tt.typ+`"`) {
			t.Errorf("CheckType(%q) = %v, want refused %v, naming the type", tt.typ, err, tt.refused)
		}
	}
	if PointType("end") != "berth_snapshot_end" || !IsPoint("get_sources") || IsPoint("after_script") {
		t.Error("PointType or IsPoint")
	}
}
