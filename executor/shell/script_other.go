//go:build !linux

package shell

import "os"

func scriptFile(tmpDir, stage, script string) (*os.File, string, func(), error) {
	return tempScript(tmpDir, stage, script)
}
