package sim

import (
	"bytes"
	"fmt"
	"sort"

	"github.com/BurntSushi/toml"

	"github.com/berthci/berth/taskscaler"
)

// AutoscalerFromTOML finds the [runners.autoscaler] table in a GitLab
// Runner config.toml and decodes it. With [[runners]] entries, runner
// names the entry (empty: the first with an autoscaler table); a file with
// a lone [runners.autoscaler] table works too. Unknown keys are returned
// for the caller to warn about.
func AutoscalerFromTOML(data []byte, runner string) (taskscaler.Config, []string, error) {
	var doc map[string]any
	if _, err := toml.Decode(string(data), &doc); err != nil {
		return taskscaler.Config{}, nil, err
	}
	var table map[string]any
	switch rs := doc["runners"].(type) {
	case []map[string]any:
		var names []string
		for _, r := range rs {
			name, _ := r["name"].(string)
			names = append(names, fmt.Sprintf("%q", name))
			a, ok := r["autoscaler"].(map[string]any)
			if ok && (runner == "" || name == runner) {
				table = a
				break
			}
		}
		if table == nil {
			sort.Strings(names)
			return taskscaler.Config{}, nil, fmt.Errorf("no [[runners]] entry %s with [runners.autoscaler] (entries: %v)", quoteOr(runner), names)
		}
	case map[string]any:
		a, ok := rs["autoscaler"].(map[string]any)
		if !ok {
			return taskscaler.Config{}, nil, fmt.Errorf("no [runners.autoscaler] table")
		}
		table = a
	default:
		return taskscaler.Config{}, nil, fmt.Errorf("no [runners.autoscaler] table")
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(table); err != nil {
		return taskscaler.Config{}, nil, err
	}
	return taskscaler.DecodeConfig(buf.String())
}

func quoteOr(s string) string {
	if s == "" {
		return ""
	}
	return fmt.Sprintf("%q", s)
}
