package postgres

import "testing"

func TestRebind(t *testing.T) {
	tests := []struct{ in, want string }{
		{"SELECT 1", "SELECT 1"},
		{"SELECT a FROM t WHERE x = ? AND y IN (?, ?)", "SELECT a FROM t WHERE x = $1 AND y IN ($2, $3)"},
		{"UPDATE t SET s = 'what?' WHERE id = ?", "UPDATE t SET s = 'what?' WHERE id = $1"},
		{`SELECT "odd?col" FROM t WHERE a = ?`, `SELECT "odd?col" FROM t WHERE a = $1`},
		{"SELECT ? -- why?\n, ?", "SELECT $1 -- why?\n, $2"},
		{"SELECT 'it''s?', ?", "SELECT 'it''s?', $1"},
		{"SELECT 'unterminated ?", "SELECT 'unterminated ?"},
		{"SELECT ? --", "SELECT $1 --"},
	}
	for _, tt := range tests {
		if got := rebind(tt.in); got != tt.want {
			t.Errorf("rebind(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestArgsBooleans(t *testing.T) {
	in := []any{"a", true, int64(3), false, nil}
	out := args(in)
	want := []any{"a", int64(1), int64(3), int64(0), nil}
	for i := range want {
		if out[i] != want[i] {
			t.Errorf("args[%d] = %#v, want %#v", i, out[i], want[i])
		}
	}
	if in[1] != true {
		t.Error("args changed its input")
	}
	plain := []any{"x", int64(1)}
	if got := args(plain); &got[0] != &plain[0] {
		t.Error("args copied a list without booleans")
	}
}
