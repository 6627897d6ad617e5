package host

// WithoutDeathSignal makes the host start plugins without the kernel's
// parent-death signal, so a test can show SDK plugins notice a dead host by
// themselves.
func WithoutDeathSignal(c *Config) { c.noDeathSignal = true }
