package docker

// HelperMount is where the helper bundle (internal/bundle.Helper) is
// mounted (read-only) in every job container; Environment.Helper is
// HelperMount + "/berth".
const HelperMount = "/usr/local/berth"
