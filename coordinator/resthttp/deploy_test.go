package resthttp

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

func TestSortList(t *testing.T) {
	for _, tt := range []struct {
		sort, def string
		want      []int
		ok        bool
	}{
		{"", "desc", []int{3, 2, 1}, true},
		{"desc", "desc", []int{3, 2, 1}, true},
		{"asc", "desc", []int{1, 2, 3}, true},
		{"desc", "asc", []int{1, 2, 3}, true},
		{"up", "asc", []int{3, 2, 1}, false},
	} {
		list := []int{3, 2, 1}
		w := httptest.NewRecorder()
		ok := sortList(w, tt.sort, tt.def, list)
		if ok != tt.ok || !slices.Equal(list, tt.want) || (!ok && w.Code != http.StatusBadRequest) {
			t.Errorf("sort %q (default %s): %v %v code %d", tt.sort, tt.def, list, ok, w.Code)
		}
	}
}
