package githost

import (
	"errors"
	"fmt"
	"strings"
)

// maxPathSegments bounds the depth of a project path.
const maxPathSegments = 20

// ParseProjectPath checks a project's full path ("group/sub/name") the
// way GitLab names paths: segments of letters, digits, '_', '-' and '.',
// not starting with '-' or '.', not ending with '.', '.git' or '.atom'. It
// returns the path without surrounding slashes. An error says what is
// wrong with the path; every error means an invalid path.
func ParseProjectPath(p string) (string, error) {
	p = strings.Trim(p, "/")
	if p == "" {
		return "", errors.New("project path is empty")
	}
	if len(p) > 1024 {
		return "", errors.New("project path is longer than 1024 characters")
	}
	segs := strings.Split(p, "/")
	if len(segs) > maxPathSegments {
		return "", fmt.Errorf("project path %q has more than %d segments", p, maxPathSegments)
	}
	for _, seg := range segs {
		if err := checkPathSegment(seg); err != nil {
			return "", fmt.Errorf("project path %q: %w", p, err)
		}
	}
	return p, nil
}

func checkPathSegment(seg string) error {
	if seg == "" {
		return errors.New("empty segment")
	}
	if len(seg) > 255 {
		return errors.New("segment longer than 255 characters")
	}
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
		if !ok {
			return fmt.Errorf("segment %q: only letters, digits, '_', '-' and '.' are allowed", seg)
		}
	}
	if seg[0] == '-' || seg[0] == '.' || seg[len(seg)-1] == '.' {
		return fmt.Errorf("segment %q must not start with '-' or '.' or end with '.'", seg)
	}
	low := strings.ToLower(seg)
	if strings.HasSuffix(low, ".git") || strings.HasSuffix(low, ".atom") {
		return fmt.Errorf("segment %q must not end with .git or .atom", seg)
	}
	return nil
}
