package ci

import (
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
)

// GitLab reads .gitlab-ci.yml with Ruby's YAML library (Psych, through
// YAML.safe_load with symbols permitted) and stores a variable's value as
// the Ruby object's to_s. A plain (unquoted) scalar that Psych reads as a
// number is therefore not kept as written: 3.10 is the Float 3.1,
// 40_000_000 the Integer 40000000, 0755 the octal 493, 1:30 the base-60
// 5400. psychScalar gives what GitLab stores, so that a file's variables
// have on Berth the values they have on GitLab. Its cases follow
// Psych::ScalarScanner#tokenize (Psych 4 and 5, integers with commas
// allowed as there by default) in its order; TestPsychScalarAgainstRuby
// checks it against Ruby itself.

// psychKind is what Psych makes of a plain scalar.
type psychKind int

const (
	psychString psychKind = iota // a string: kept as written
	psychValue                   // a number or symbol: its to_s
	psychDate                    // a date or time: GitLab's safe_load refuses it
	psychError                   // Psych itself fails on it (e.g. 0x_)
)

var (
	// psychStringRe: the scalar is a string (booleans and null among
	// them are the caller's).
	psychStringRe  = regexp.MustCompile(`^[^\d.:-]?[[:alpha:]_\s!@#$%^&*(){}<>|/\\~;=]+`)
	psychTimeRe    = regexp.MustCompile(`^-?\d{4}-\d{1,2}-\d{1,2}(?:[Tt]|\s+)\d{1,2}:\d\d:\d\d(?:\.\d*)?(?:\s*(?:Z|[-+]\d{1,2}:?(?:\d\d)?))?$`)
	psychDateRe    = regexp.MustCompile(`^\d{4}-(?:1[012]|0\d|\d)-(?:[12]\d|3[01]|0\d|\d)$`)
	psychInfRe     = regexp.MustCompile(`(?i)^\+?\.inf$`)
	psychNegInfRe  = regexp.MustCompile(`(?i)^-\.inf$`)
	psychNaNRe     = regexp.MustCompile(`(?i)^\.nan$`)
	psychSymbolRe  = regexp.MustCompile(`^:.`)
	psychBase60Int = regexp.MustCompile(`^[-+]?[0-9][0-9_]*(:[0-5]?[0-9]){1,2}$`)
	psychBase60Flt = regexp.MustCompile(`^[-+]?[0-9][0-9_]*(:[0-5]?[0-9]){1,2}\.[0-9_]*$`)
	psychFloatRe   = regexp.MustCompile(`^(?:[-+]?([0-9][0-9_,]*)?\.[0-9]*([eE][-+][0-9]+)?)$`)
	psychLoneDot   = regexp.MustCompile(`^[-+]?\.$`)
	psychIntegerRe = regexp.MustCompile(`^(?:[-+]?0b[0-1_,]+|[-+]?0[0-7_,]+|[-+]?(?:0|[1-9](?:[0-9]|,[0-9]|_[0-9])*)|[-+]?0x[0-9a-fA-F_,]+)$`)
)

// psychWordKind is what psychWord makes of a scalar.
type psychWordKind uint8

const (
	wordNone psychWordKind = iota
	wordTrue
	wordFalse
	wordNull
)

// psychWord is what Psych makes of a plain scalar that is one of its
// words, matched in any case as ScalarScanner#tokenize does: true for
// yes, true, on; false for no, false, off; null for null, ~ and nothing.
// psychScalar leaves them to its callers.
func psychWord(s string) psychWordKind {
	switch {
	case s == "" || s == "~" || strings.EqualFold(s, "null"):
		return wordNull
	case len(s) > 5:
		return wordNone
	}
	for _, w := range [...]string{"yes", "true", "on"} {
		if strings.EqualFold(s, w) {
			return wordTrue
		}
	}
	for _, w := range [...]string{"no", "false", "off"} {
		if strings.EqualFold(s, w) {
			return wordFalse
		}
	}
	return wordNone
}

// psychScalar is what GitLab stores for the plain scalar s as a variable's
// value, and what kind of scalar Psych reads it as. For psychString,
// psychDate and psychError the value is s itself.
func psychScalar(s string) (string, psychKind) {
	if s == "" {
		return s, psychString
	}
	switch c := s[0]; {
	case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_':
		return s, psychString // what psychStringRe matches first, without a regexp
	case psychStringRe.MatchString(s) || strings.Contains(s, "\n"):
		return s, psychString
	case psychTimeRe.MatchString(s), psychDateRe.MatchString(s):
		return s, psychDate
	case psychInfRe.MatchString(s):
		return "Infinity", psychValue
	case psychNegInfRe.MatchString(s):
		return "-Infinity", psychValue
	case psychNaNRe.MatchString(s):
		return "NaN", psychValue
	case psychSymbolRe.MatchString(s):
		// :"a b" — Ruby's =~ /^:(["'])(.*)\1/: the text up to the last
		// same quote.
		if q := s[1]; q == '"' || q == '\'' {
			if end := strings.LastIndexByte(s[2:], q); end >= 0 {
				return strings.TrimPrefix(s[2:2+end], ":"), psychValue
			}
		}
		return s[1:], psychValue
	case psychBase60Int.MatchString(s):
		sum := new(big.Int)
		for e, part := range strings.Split(s, ":") {
			n := RubyToI(part)
			sum.Add(sum, n.Mul(n, new(big.Int).Exp(big.NewInt(60), big.NewInt(int64(abs(e-2))), nil)))
		}
		return sum.String(), psychValue
	case psychBase60Flt.MatchString(s):
		sum := 0.0
		for e, part := range strings.Split(s, ":") {
			sum += rubyToF(part) * math.Pow(60, float64(abs(e-2)))
		}
		return rubyFloat(sum), psychValue
	case psychFloatRe.MatchString(s):
		if psychLoneDot.MatchString(s) {
			return s, psychString
		}
		t := strings.NewReplacer(",", "", "_", "").Replace(s)
		// gsub(/\.([Ee]|$)/, '\1'): a dot before the exponent or at
		// the end goes.
		if i := strings.IndexAny(t, "eE"); i > 0 && t[i-1] == '.' {
			t = t[:i-1] + t[i:]
		} else if strings.HasSuffix(t, ".") {
			t = strings.TrimSuffix(t, ".")
		}
		f, ok := rubyStrictFloat(t)
		if !ok {
			return s, psychError
		}
		return rubyFloat(f), psychValue
	case psychIntegerRe.MatchString(s):
		n, ok := rubyInteger(strings.NewReplacer(",", "", "_", "").Replace(s))
		if !ok {
			return s, psychError
		}
		return n.String(), psychValue
	}
	return s, psychString
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// RubyToI is Ruby's String#to_i: the leading integer after leading
// whitespace (sign, digits with single underscores between them), 0 if
// none. GitLab reads numbers given as text this way (GIT_DEPTH, …).
func RubyToI(s string) *big.Int {
	s = strings.TrimLeft(s, " \t\n\v\f\r")
	i, neg := 0, false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	var digits strings.Builder
	for ; i < len(s); i++ {
		c := s[i]
		if c >= '0' && c <= '9' {
			digits.WriteByte(c)
			continue
		}
		if c == '_' && digits.Len() > 0 && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' {
			continue
		}
		break
	}
	n, ok := new(big.Int).SetString(digits.String(), 10)
	if !ok {
		return new(big.Int)
	}
	if neg {
		n.Neg(n)
	}
	return n
}

// rubyToF is Ruby's String#to_f for the parts of a base-60 float: digits
// with underscores between them, and a fraction.
func rubyToF(s string) float64 {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9', c == '.' && !strings.Contains(b.String(), "."), (c == '+' || c == '-') && i == 0:
			b.WriteByte(c)
		case c == '_' && i > 0 && i+1 < len(s) && s[i-1] >= '0' && s[i-1] <= '9' && s[i+1] >= '0' && s[i+1] <= '9':
		default:
			i = len(s)
		}
	}
	f, _ := strconv.ParseFloat(strings.TrimSuffix(b.String(), "."), 64)
	return f
}

// rubyStrictFloat is Ruby's Float() on what the float pattern left: a
// decimal with an optional exponent; a leading dot is allowed.
func rubyStrictFloat(s string) (float64, bool) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			return f, true // ±Inf or 0, as Ruby's strtod gives
		}
		return 0, false
	}
	return f, true
}

// rubyInteger is Ruby's Integer() on a literal the integer pattern
// admitted, commas and underscores removed: the prefix picks the base (0b
// binary, 0x hex, 0 octal).
func rubyInteger(s string) (*big.Int, bool) {
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	base := 10
	switch {
	case strings.HasPrefix(s, "0b"):
		base, s = 2, s[2:]
	case strings.HasPrefix(s, "0x"):
		base, s = 16, s[2:]
	case len(s) > 1 && s[0] == '0':
		base, s = 8, s[1:]
	}
	n, ok := new(big.Int).SetString(s, base)
	if !ok {
		return nil, false
	}
	if neg {
		n.Neg(n)
	}
	return n, true
}

// rubyFloat is Ruby's Float#to_s: the shortest digits that read back as
// f; fixed notation (with ".0" when whole) while at most 15 digits come
// before the decimal point (16 when digits follow it) or at most 3 zeros
// after it, "d.ddde+XX" otherwise.
func rubyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case math.IsNaN(f):
		return "NaN"
	}
	sign := ""
	if math.Signbit(f) {
		sign, f = "-", -f
	}
	if f == 0 {
		return sign + "0.0"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, exp, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	decpt := x + 1 // digits before the decimal point
	switch {
	case decpt > 0 && (decpt <= 15 || decpt == 16 && len(digits) > decpt):
		if len(digits) <= decpt {
			return sign + digits + strings.Repeat("0", decpt-len(digits)) + ".0"
		}
		return sign + digits[:decpt] + "." + digits[decpt:]
	case decpt <= 0 && decpt > -4:
		return sign + "0." + strings.Repeat("0", -decpt) + digits
	}
	frac := digits[1:]
	if frac == "" {
		frac = "0"
	}
	es := "+"
	if x < 0 {
		es, x = "-", -x
	}
	return sign + digits[:1] + "." + frac + "e" + es + fmtExp(x)
}

func fmtExp(x int) string {
	s := strconv.Itoa(x)
	if len(s) < 2 {
		s = "0" + s
	}
	return s
}
