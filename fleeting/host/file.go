package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/berthci/berth/fleeting"
)

// FileConfig is the fleeting part of a configuration file, as the operator
// CLI reads it.
type FileConfig struct {
	// Plugin is the plugin reference, if the file names one.
	Plugin string
	// PluginConfig is plugin_config re-encoded as JSON ("{}" if absent).
	PluginConfig json.RawMessage
	// Settings come from connector_config.
	Settings fleeting.Settings
	// UseExternalAddr is connector_config's use_external_addr.
	UseExternalAddr bool
}

// ParseFile reads the fleeting configuration from a file's contents. Two
// shapes are accepted, in TOML (or JSON when name ends in .json):
//
//   - a GitLab Runner config.toml: the [runners.autoscaler] table of the
//     [[runners]] entry named runner (or of the first entry that has one when
//     runner is ""), with its plugin, plugin_config and connector_config;
//   - a file with just those three keys at the top level.
//
// connector_config has config.toml's keys: os, arch, protocol,
// protocol_port, username, password, key_path (read relative to the file's
// directory dir), use_static_credentials, keepalive, timeout (durations
// such as "30s") and use_external_addr.
func ParseFile(name, dir string, data []byte, runner string) (FileConfig, error) {
	var doc map[string]any
	var err error
	if strings.HasSuffix(name, ".json") {
		err = json.Unmarshal(data, &doc)
	} else {
		_, err = toml.Decode(string(data), &doc)
	}
	if err != nil {
		return FileConfig{}, fmt.Errorf("%s: %w", name, err)
	}
	table := doc
	if runners, ok := doc["runners"]; ok {
		list, ok := runners.([]map[string]any)
		if !ok {
			if l, ok2 := runners.([]any); ok2 {
				for _, r := range l {
					if m, ok := r.(map[string]any); ok {
						list = append(list, m)
					}
				}
			}
		}
		table = nil
		for _, r := range list {
			as, ok := r["autoscaler"].(map[string]any)
			if !ok {
				continue
			}
			if n, _ := r["name"].(string); runner == "" || n == runner {
				table = as
				break
			}
		}
		if table == nil {
			if runner != "" {
				return FileConfig{}, fmt.Errorf("%s: no [[runners]] entry named %q with an [runners.autoscaler] table", name, runner)
			}
			return FileConfig{}, fmt.Errorf("%s: no [[runners]] entry has an [runners.autoscaler] table", name)
		}
	}
	var fc FileConfig
	if p, ok := table["plugin"]; ok {
		s, ok := p.(string)
		if !ok {
			return FileConfig{}, fmt.Errorf("%s: plugin must be a string", name)
		}
		fc.Plugin = s
	}
	fc.PluginConfig = json.RawMessage("{}")
	if pc, ok := table["plugin_config"]; ok {
		if _, ok := pc.(map[string]any); !ok {
			return FileConfig{}, fmt.Errorf("%s: plugin_config must be a table", name)
		}
		b, err := json.Marshal(pc)
		if err != nil {
			return FileConfig{}, fmt.Errorf("%s: plugin_config: %w", name, err)
		}
		fc.PluginConfig = b
	}
	if cc, ok := table["connector_config"]; ok {
		m, ok := cc.(map[string]any)
		if !ok {
			return FileConfig{}, fmt.Errorf("%s: connector_config must be a table", name)
		}
		if err := fc.connector(m, dir); err != nil {
			return FileConfig{}, fmt.Errorf("%s: connector_config: %w", name, err)
		}
	}
	return fc, nil
}

func (fc *FileConfig) connector(m map[string]any, dir string) error {
	c := &fc.Settings.ConnectorConfig
	for k, v := range m {
		var err error
		switch k {
		case "os":
			c.OS, err = str(v)
		case "arch":
			c.Arch, err = str(v)
		case "protocol":
			var s string
			s, err = str(v)
			c.Protocol = fleeting.Protocol(s)
		case "username":
			c.Username, err = str(v)
		case "password":
			c.Password, err = str(v)
		case "protocol_port":
			c.ProtocolPort, err = integer(v)
			if err == nil && (c.ProtocolPort < 0 || c.ProtocolPort > 65535) {
				err = fmt.Errorf("%d out of range", c.ProtocolPort)
			}
		case "key_path":
			var p string
			if p, err = str(v); err == nil && p != "" {
				if !filepath.IsAbs(p) {
					p = filepath.Join(dir, p)
				}
				c.Key, err = os.ReadFile(p)
			}
		case "use_static_credentials":
			c.UseStaticCredentials, err = boolean(v)
		case "use_external_addr":
			fc.UseExternalAddr, err = boolean(v)
		case "keepalive":
			c.Keepalive, err = duration(v)
		case "timeout":
			c.Timeout, err = duration(v)
		default:
			err = errors.New("unknown key")
		}
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}

func str(v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("want a string, got %T", v)
	}
	return s, nil
}

func boolean(v any) (bool, error) {
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("want true or false, got %T", v)
	}
	return b, nil
}

func integer(v any) (int, error) {
	switch n := v.(type) {
	case int64:
		return int(n), nil
	case float64:
		if n == float64(int(n)) {
			return int(n), nil
		}
	}
	return 0, fmt.Errorf("want an integer, got %v", v)
}

// duration reads "30s"-style strings; bare numbers are nanoseconds, as on
// the wire.
func duration(v any) (time.Duration, error) {
	if s, ok := v.(string); ok {
		return time.ParseDuration(s)
	}
	n, err := integer(v)
	return time.Duration(n), err
}
