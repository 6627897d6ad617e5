package pgurl

import "testing"

func TestInSchema(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://u:p@h:5432/db":                         "postgres://u:p@h:5432/db?search_path=t_1",
		"postgresql://h/db?sslmode=disable":                "postgresql://h/db?sslmode=disable&search_path=t_1",
		"postgres://h/db?options=-c%20statement_timeout=5": "postgres://h/db?options=-c%20statement_timeout=5&search_path=t_1",
	} {
		if got, err := InSchema(dsn, "t_1"); err != nil || got != want {
			t.Errorf("InSchema(%q) = %q, %v; want %q", dsn, got, err, want)
		}
	}
	for _, bad := range []string{"mysql://h/db", "host=h dbname=db", "://"} {
		if _, err := InSchema(bad, "t_1"); err == nil {
			t.Errorf("InSchema(%q) succeeded", bad)
		}
	}
}
