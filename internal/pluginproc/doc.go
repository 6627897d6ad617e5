// Package pluginproc is the process plumbing Berth's go-plugin hosts and
// SDKs share (fleeting plugins and executor plugins): on the host side a
// go-plugin runner that notices a plugin's exit at once and asks the kernel
// to kill the plugin with the host, and a relay of the plugin's stderr into
// the host's structured log; on the plugin side the hclog-compatible log
// handler and a watch on the parent process.
package pluginproc
