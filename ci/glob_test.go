package ci

import "testing"

func TestMatchGlob(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"*.go", "main.go", true},
		{"*.go", "cmd/main.go", false},
		{"**/*.go", "main.go", true},
		{"**/*.go", "cmd/berth/main.go", true},
		{"cmd/**/*.go", "cmd/main.go", true},
		{"cmd/**/*.go", "cmd/a/b/main.go", true},
		{"cmd/**/*.go", "pkg/main.go", false},
		{"docs/**", "docs/a.md", true},
		{"docs/**", "docs/a/b.md", false}, // ** not before / is * with FNM_PATHNAME
		{"docs/*", "docs/.hidden", true},  // FNM_DOTMATCH
		{"?.txt", "a.txt", true},
		{"?.txt", "ab.txt", false},
		{"[abc].txt", "b.txt", true},
		{"[!abc].txt", "b.txt", false},
		{"[a-c].txt", "c.txt", true},
		{"{src,lib}/*.rb", "lib/x.rb", true},
		{"{src,lib}/*.rb", "bin/x.rb", false},
		{"*.{yml,yaml}", "a.yaml", true},
		{`\*.txt`, "*.txt", true},
		{`\*.txt`, "a.txt", false},
		{"Dockerfile", "Dockerfile", true},
		{"Dockerfile", "sub/Dockerfile", false},
		{"[unterminated", "[unterminated", true},
	}
	for _, tt := range tests {
		if got := MatchGlob(tt.pattern, tt.name); got != tt.want {
			t.Errorf("MatchGlob(%q, %q) = %v, want %v", tt.pattern, tt.name, got, tt.want)
		}
	}
	// include:local wildcards: ** alone crosses directories.
	if !matchGlob("configs/**.yml", "configs/a/b.yml", true) || matchGlob("configs/*.yml", "configs/a/b.yml", true) {
		t.Error("include wildcard semantics broken")
	}
}
