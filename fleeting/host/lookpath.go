package host

import "os/exec"

var execLookPath = exec.LookPath
