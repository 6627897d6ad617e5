package host_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthci/berth/fleeting/host"
)

func TestParseFile(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "id_ed25519"), []byte("KEY"), 0o600)
	configToml := `
concurrent = 4
[[runners]]
  name = "docker"
[[runners]]
  name = "fleet"
  executor = "docker-autoscaler"
  [runners.autoscaler]
    plugin = "fleeting-plugin-aws"
    max_instances = 10
    [runners.autoscaler.plugin_config]
      name = "asg"
      region = "eu-west-1"
      nested = { list = [1, 2] }
    [runners.autoscaler.connector_config]
      username = "ec2-user"
      key_path = "id_ed25519"
      use_external_addr = true
      keepalive = "30s"
      timeout = "2m"
      protocol_port = 2222
`
	fc, err := host.ParseFile("config.toml", dir, []byte(configToml), "")
	if err != nil {
		t.Fatal(err)
	}
	if fc.Plugin != "fleeting-plugin-aws" || string(fc.PluginConfig) != `{"name":"asg","nested":{"list":[1,2]},"region":"eu-west-1"}` ||
		fc.Settings.Username != "ec2-user" || string(fc.Settings.Key) != "KEY" || !fc.UseExternalAddr ||
		fc.Settings.Keepalive != 30*time.Second || fc.Settings.Timeout != 2*time.Minute || fc.Settings.ProtocolPort != 2222 {
		t.Fatalf("ParseFile = %+v (plugin_config %s)", fc, fc.PluginConfig)
	}
	if _, err := host.ParseFile("config.toml", dir, []byte(configToml), "docker"); err == nil {
		t.Error("runner without autoscaler was accepted")
	}

	flat := `{"plugin_config": {"seed": 1}, "connector_config": {"username": "u", "timeout": 5000000000}}`
	fc, err = host.ParseFile("x.json", dir, []byte(flat), "")
	if err != nil || string(fc.PluginConfig) != `{"seed":1}` || fc.Settings.Timeout != 5*time.Second || fc.Plugin != "" {
		t.Fatalf("ParseFile(json) = %+v, %v", fc, err)
	}
	fc, err = host.ParseFile("empty.toml", dir, nil, "")
	if err != nil || string(fc.PluginConfig) != "{}" {
		t.Fatalf("ParseFile(empty) = %+v, %v", fc, err)
	}
	for _, bad := range []string{
		`[connector_config]` + "\n" + `usernme = "x"`,
		`[connector_config]` + "\n" + `timeout = "soon"`,
		`[connector_config]` + "\n" + `protocol_port = 70000`,
		`plugin_config = 3`,
		`plugin = 3`,
		`[connector_config]` + "\n" + `key_path = "missing"`,
	} {
		if _, err := host.ParseFile("bad.toml", dir, []byte(bad), ""); err == nil {
			t.Errorf("ParseFile(%q) succeeded", bad)
		}
	}
}

func FuzzParseFile(f *testing.F) {
	f.Add("c.toml", []byte("[[runners]]\n[runners.autoscaler]\nplugin = \"x\"\n[runners.autoscaler.plugin_config]\na = 1\n"), "")
	f.Add("c.json", []byte(`{"plugin_config":{"a":[1,{"b":null}]},"connector_config":{"keepalive":"1s"}}`), "")
	f.Add("c.toml", []byte("[[runners]]\nname = \"r\"\n"), "r")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, name string, data []byte, runner string) {
		fc, err := host.ParseFile(name, dir, data, runner)
		if err != nil {
			return
		}
		if len(fc.PluginConfig) == 0 || fc.PluginConfig[0] != '{' {
			t.Fatalf("plugin_config %q is not a JSON object", fc.PluginConfig)
		}
	})
}
