package ci

import "testing"

func TestExpressionEval(t *testing.T) {
	vars := map[string]string{
		"BRANCH": "main",
		"EMPTY":  "",
		"BLANK":  "   ",
		"TAG":    "v1.2.3",
		"RE":     "/^v\\d+/",
		"PLAIN":  "release-main",
		"MIXED":  "MaIn",
		"ML":     "a\nmain",
	}
	tests := []struct {
		expr string
		want bool
	}{
		{`$BRANCH`, true},
		{`$UNDEFINED`, false},
		{`$EMPTY`, false},
		{`$BLANK`, false}, // Ruby's present? treats whitespace as blank
		{`$BRANCH == "main"`, true},
		{`$BRANCH == 'main'`, true},
		{`$BRANCH == "dev"`, false},
		{`"main" == $BRANCH`, true},
		{`$BRANCH != "dev"`, true},
		{`$BRANCH != "main"`, false},
		{`$UNDEFINED == null`, true},
		{`$EMPTY == null`, false},
		{`$EMPTY == ""`, true},
		{`$UNDEFINED == ""`, false},
		{`$UNDEFINED != null`, false},
		{`$BRANCH == $BRANCH`, true},
		{`$BRANCH == $PLAIN`, false},
		{`$TAG =~ /^v\d+\.\d+/`, true},
		{`$TAG =~ /^V/`, false},
		{`$TAG =~ /^V/i`, true},
		{`$TAG !~ /^V/`, true},
		{`$TAG !~ /^v/`, false},
		{`$UNDEFINED =~ /x/`, false},
		{`$UNDEFINED =~ /^$/`, true}, // nil.to_s is ""
		{`$UNDEFINED !~ /x/`, true},
		{`$ML =~ /^main$/`, false},
		{`$ML =~ /^main$/m`, true},
		{`$ML =~ /a.main/`, false},
		{`$ML =~ /a.main/s`, true},
		{`$MIXED =~ /main/`, false},
		{`$MIXED =~ /main/i`, true},
		{`$TAG =~ /v1\/2/`, false},
		{`"a/b" =~ /a\/b/`, true},
		// A variable on the right is a pattern when it looks like one...
		{`$TAG =~ $RE`, true},
		// ...and otherwise GitLab's String#scan fallback: a substring test.
		{`"main" =~ $PLAIN`, true},
		{`"dev" =~ $PLAIN`, false},
		{`$TAG =~ $UNDEFINED`, false},
		{`$TAG !~ $UNDEFINED`, true},
		// && binds tighter than ||.
		{`$BRANCH == "dev" && $TAG || $BRANCH == "main"`, true},
		{`$BRANCH == "main" || $TAG && $UNDEFINED`, true},
		{`($BRANCH == "main" || $TAG) && $UNDEFINED`, false},
		{`$BRANCH == "dev" || $UNDEFINED && $TAG`, false},
		{`$BRANCH && $TAG`, true},
		{`$BRANCH && $UNDEFINED`, false},
		{`$UNDEFINED || $TAG`, true},
		// && returns an operand: "" is truthy in Ruby, so the result is $TAG.
		{`$EMPTY && $TAG`, true},
		{`$TAG && $EMPTY`, false},
		{`((($BRANCH)))`, true},
		{`true`, true},
		{`false`, false},
		{`null`, false},
		{`"text"`, true},
		{`""`, false},
	}
	for _, tt := range tests {
		e, err := ParseExpression(tt.expr)
		if err != nil {
			t.Errorf("ParseExpression(%q): %v", tt.expr, err)
			continue
		}
		if got := e.Eval(vars); got != tt.want {
			t.Errorf("%s = %v, want %v", tt.expr, got, tt.want)
		}
	}
}

func TestExpressionSyntaxErrors(t *testing.T) {
	tests := []struct{ expr, want string }{
		{``, "empty expression"},
		{`$A ==`, "expression ends where a value is expected"},
		{`$A == "b`, "unterminated string"},
		{`($A == "b"`, "unbalanced parenthesis"},
		{`$A == "b")`, "unexpected )"},
		{`$A = "b"`, `unknown token at "= \"b\""`},
		{`$A =~ /(/`, "invalid regular expression /(/: missing closing ): `(`"},
		{`$A =~ /abc`, "unterminated regular expression"},
		{`$A == "b" &&`, "expression ends where a value is expected"},
		{`$A $B`, "unexpected value"},
		{`$[[ inputs.x ]] == "y"`, "inputs ($[[ inputs.NAME ]]) are not supported"},
		{`&& $A`, "unexpected &&"},
		{`$`, `unknown token at "$"`},
	}
	for _, tt := range tests {
		_, err := ParseExpression(tt.expr)
		if err == nil {
			t.Errorf("ParseExpression(%q) succeeded, want %q", tt.expr, tt.want)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("ParseExpression(%q) = %q, want %q", tt.expr, err, tt.want)
		}
	}
}

func TestExpressionTooManyTokens(t *testing.T) {
	s := "$A"
	for i := 0; i < 60; i++ {
		s += " || $A"
	}
	if _, err := ParseExpression(s); err == nil || err.Error() != "too many tokens (more than 100)" {
		t.Fatalf("got %v", err)
	}
}
