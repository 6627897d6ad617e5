package executor

import "testing"

func TestSafeName(t *testing.T) {
	for in, want := range map[string]string{
		"step_script": "step_script", "a/b": "a_b", "..": "__", ".": "_", "x y\x00z": "x_y_z", "Ünïcode-1": "_n_code-1",
	} {
		if got := SafeName(in); got != want {
			t.Errorf("SafeName(%q) = %q, want %q", in, got, want)
		}
	}
}
