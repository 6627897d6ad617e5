package custom

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// ConfigOutput is what config_exec may print on its stdout, as GitLab
// defines it: one JSON object, every key optional, unknown keys ignored.
// Empty output (only white space, or null) changes nothing; anything that
// is not one JSON object fails the preparation.
//
//	{
//	  "builds_dir": "/builds",            // overrides [[runners]] builds_dir
//	  "cache_dir": "/cache",              // overrides [[runners]] cache_dir
//	  "builds_dir_is_shared": true,       // see Environment.BuildDir in the package doc
//	  "hostname": "vm-42",                // shown in the job log
//	  "driver": {"name": "lxd", "version": "v1.0"},
//	  "job_env": {"VM_ID": "42"},         // plain variables of later driver calls
//	  "shell": "bash"                     // overrides [[runners]] shell (bash or sh)
//	}
type ConfigOutput struct {
	BuildsDir         *string           `json:"builds_dir,omitempty"`
	CacheDir          *string           `json:"cache_dir,omitempty"`
	BuildsDirIsShared *bool             `json:"builds_dir_is_shared,omitempty"`
	Hostname          *string           `json:"hostname,omitempty"`
	Driver            *DriverInfo       `json:"driver,omitempty"`
	JobEnv            map[string]string `json:"job_env,omitempty"`
	Shell             *string           `json:"shell,omitempty"`
}

// DriverInfo names the driver in the job log: "Using Custom executor with
// driver <name> <version>...".
type DriverInfo struct {
	Name    *string `json:"name,omitempty"`
	Version *string `json:"version,omitempty"`
}

// maxConfigOutput bounds what config_exec may print: a config is a few
// hundred bytes, more is a driver printing something else.
const maxConfigOutput = 1 << 20

// parseConfigOutput reads config_exec's stdout.
func parseConfigOutput(b []byte) (ConfigOutput, error) {
	var c ConfigOutput
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return c, nil
	}
	if len(b) > maxConfigOutput {
		return ConfigOutput{}, fmt.Errorf("parsing config_exec output: %d bytes, more than the %d a config may have", len(b), maxConfigOutput)
	}
	if b[0] != '{' && !bytes.Equal(b, []byte("null")) {
		return ConfigOutput{}, fmt.Errorf("parsing config_exec output: want one JSON object, got %q", abbreviate(b))
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return ConfigOutput{}, fmt.Errorf("parsing config_exec output: %w", err)
	}
	for k, v := range c.JobEnv {
		if !validEnvKey(k) {
			return ConfigOutput{}, fmt.Errorf("parsing config_exec output: job_env key %q: not usable as an environment variable name", k)
		}
		if strings.ContainsRune(v, 0) {
			return ConfigOutput{}, fmt.Errorf("parsing config_exec output: job_env %s: value holds a NUL byte", k)
		}
	}
	return c, nil
}

// validEnvKey reports whether k can be the name of an environment entry.
func validEnvKey(k string) bool {
	return k != "" && !strings.ContainsAny(k, "=\x00")
}

func abbreviate(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "…"
	}
	return string(b)
}

// startupLine is the job log's line naming the driver.
func (c ConfigOutput) startupLine() string {
	const usage = "Using Custom executor"
	switch d := c.Driver; {
	case d == nil || d.Name == nil:
		return usage + "..."
	case d.Version == nil:
		return fmt.Sprintf("%s with driver %s...", usage, *d.Name)
	default:
		return fmt.Sprintf("%s with driver %s %s...", usage, *d.Name, *d.Version)
	}
}
