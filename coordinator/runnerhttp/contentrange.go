package runnerhttp

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseContentRange parses a trace PATCH Content-Range: "<start>-<end>",
// byte offsets with end inclusive and no unit, as gitlab-runner sends it.
// A leading "bytes " unit is tolerated.
func ParseContentRange(v string) (start, end int64, err error) {
	s := strings.TrimSpace(v)
	s = strings.TrimPrefix(s, "bytes ")
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("Content-Range %q: want <start>-<end>", v)
	}
	start, err1 := strconv.ParseInt(a, 10, 64)
	end, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || start < 0 || end < start {
		return 0, 0, fmt.Errorf("Content-Range %q: want <start>-<end> with 0 <= start <= end", v)
	}
	return start, end, nil
}
