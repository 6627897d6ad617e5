package taskscaler

import (
	"errors"
	"fmt"
	"math"
	"os"
	"time"
	_ "time/tzdata" // policy time zones load on hosts without a zone database

	"github.com/BurntSushi/toml"

	"github.com/berthci/berth/fleeting"
	"github.com/berthci/berth/internal/cron"
	"github.com/berthci/berth/taskscaler/forecast"
)

// Defaults of GitLab Runner (reference §5.6) and of Berth's own keys.
const (
	DefaultCapacityPerInstance         = 1
	DefaultInstanceAcquireTimeout      = 15 * time.Minute
	DefaultUpdateInterval              = time.Minute
	DefaultUpdateIntervalWhenExpecting = 2 * time.Second
	DefaultDeletionRetryInterval       = time.Minute
	DefaultShutdownDeletionInterval    = 10 * time.Second
	DefaultShutdownDeletionRetries     = 3
	DefaultFailureThreshold            = 3
	DefaultScaleThrottleLimit          = 100
	DefaultIdleTime                    = 5 * time.Minute
	MinIdleTime                        = time.Second
	DefaultInstanceReadyTimeout        = 5 * time.Minute
	DefaultInstanceReadyRetries        = 2
	DefaultInstanceCreatingTimeout     = 10 * time.Minute
	DefaultLeaseDuration               = time.Minute
	DefaultStateStorageDir             = ".taskscaler"
)

// Config is the [runners.autoscaler] table of config.toml, decoded with
// github.com/BurntSushi/toml. Keys are GitLab Runner's; the few Berth adds
// are marked. Durations are TOML strings ("15m", "2s").
//
// Load it once, call SetDefaults, then Validate, and hand it to New. Only the
// policies can change afterwards (Scaler.SetPolicies); other keys apply at
// start, as in GitLab Runner.
type Config struct {
	// Plugin is the fleeting plugin reference; the caller starts it.
	Plugin string `toml:"plugin"`
	// PluginConfig is passed to the plugin as JSON; the caller does that.
	PluginConfig map[string]any `toml:"plugin_config"`
	// ConnectorConfig is how to reach instances; sent to the plugin in Init.
	ConnectorConfig ConnectorConfig `toml:"connector_config"`

	// CapacityPerInstance is how many jobs run on one instance at once,
	// each in its own numbered slot 0..n-1 (≤0: 1).
	CapacityPerInstance int `toml:"capacity_per_instance"`
	// MaxUseCount is how many jobs an instance runs before it is removed
	// (0: unlimited).
	MaxUseCount int `toml:"max_use_count"`
	// MaxInstances caps instances in any state but gone (0: unlimited).
	MaxInstances int `toml:"max_instances"`
	// DeleteInstancesOnShutdown deletes every instance at Shutdown.
	DeleteInstancesOnShutdown bool `toml:"delete_instances_on_shutdown"`
	// InstanceReadyCommand runs on each new instance before it gets jobs.
	InstanceReadyCommand string `toml:"instance_ready_command"`
	// InstanceReadyTimeout bounds one ready-up attempt (Berth; default 5m).
	InstanceReadyTimeout time.Duration `toml:"instance_ready_timeout"`
	// InstanceReadyRetries is how many times a failed ready-up is retried
	// on the same instance before it is removed (Berth; default 2; -1: no
	// retry).
	InstanceReadyRetries int `toml:"instance_ready_retries"`
	// InstanceCreatingTimeout is how long an instance may stay creating
	// before it is removed as broken (Berth; default 10m).
	InstanceCreatingTimeout time.Duration `toml:"instance_creating_timeout"`
	// InstanceAcquireTimeout bounds Acquire's wait (default 15m).
	InstanceAcquireTimeout time.Duration `toml:"instance_acquire_timeout"`
	// UpdateInterval is how often the plugin is asked for the instance
	// list when no change is expected (default 1m).
	UpdateInterval time.Duration `toml:"update_interval"`
	// UpdateIntervalWhenExpecting is the same while instances are
	// requested, creating or deleting (default 2s).
	UpdateIntervalWhenExpecting time.Duration `toml:"update_interval_when_expecting"`
	// DeletionRetryInterval is when a deletion that had no effect is
	// asked again (default 1m).
	DeletionRetryInterval time.Duration `toml:"deletion_retry_interval"`
	// ShutdownDeletionInterval and ShutdownDeletionRetries pace deletion at
	// Shutdown (defaults 10s, 3).
	ShutdownDeletionInterval time.Duration `toml:"shutdown_deletion_interval"`
	ShutdownDeletionRetries  int           `toml:"shutdown_deletion_retries"`
	// FailureThreshold is how many consecutive failures (heartbeats,
	// acquisitions reported failed) make an instance unhealthy: it takes no
	// more jobs and is replaced (default 3).
	FailureThreshold int `toml:"failure_threshold"`
	// AcquireHeartbeats checks an instance with the plugin's Heartbeat
	// before handing out one of its slots (GitLab's
	// FF_USE_FLEETING_ACQUIRE_HEARTBEATS).
	AcquireHeartbeats bool `toml:"acquire_heartbeats"`
	// LogInternalIP and LogExternalIP are for the executor's job log.
	LogInternalIP bool `toml:"log_internal_ip"`
	LogExternalIP bool `toml:"log_external_ip"`
	// ReservationThrottling is accepted for compatibility; Berth's Reserve
	// is bounded by capacity, which makes a throttle unnecessary.
	ReservationThrottling *bool `toml:"reservation_throttling"`

	// Prediction provisions ahead of the demand the scaler learns from its
	// own history (package forecast) and removes idle instances the
	// forecast does not need, policies staying floors (idle_count,
	// scale_factor) and ceilings (idle_time, max_instances). Berth; unset:
	// on. false keeps GitLab's behaviour exactly.
	Prediction *bool `toml:"prediction"`
	// Packing gives a job a slot on the fullest ready instance that has
	// one, so the others drain and can go. Berth; unset: as Prediction.
	// false: the oldest ready instance with a free slot (GitLab's order).
	Packing *bool `toml:"packing"`
	// PredictionSpare sizes the spare prediction provisions for arrivals
	// it cannot foresee: "poisson" (unset: 95 % of Poisson arrivals and
	// departures within the horizon) or "measured" (what would have let
	// 99 % of the jobs of the last 128 minutes with arrivals start at
	// once, given the forecast's own misses, when that is more: for jobs that arrive
	// together, as a pipeline's stage does, at a price). Berth.
	PredictionSpare string `toml:"prediction_spare"`

	ScaleThrottle ScaleThrottle `toml:"scale_throttle"`
	StateStorage  StateStorage  `toml:"state_storage"`
	Policies      []Policy      `toml:"policy"`

	// VMIsolation is kept for the executors (nesting); taskscaler does not
	// act on it.
	VMIsolation map[string]any `toml:"vm_isolation"`

	// Histogram buckets (seconds) for the metrics; empty: defaults.
	InstanceReadyUpTimeBuckets  []float64 `toml:"instance_ready_up_time_buckets"`
	InstanceAcquireTimeBuckets  []float64 `toml:"instance_acquire_time_buckets"`
	InstanceLifeDurationBuckets []float64 `toml:"instance_life_duration_buckets"`
}

// ConnectorConfig is [runners.autoscaler.connector_config].
type ConnectorConfig struct {
	OS                   string        `toml:"os"`
	Arch                 string        `toml:"arch"`
	Protocol             string        `toml:"protocol"`
	ProtocolPort         int           `toml:"protocol_port"`
	Username             string        `toml:"username"`
	Password             string        `toml:"password"`
	KeyPath              string        `toml:"key_path"`
	UseStaticCredentials bool          `toml:"use_static_credentials"`
	Keepalive            time.Duration `toml:"keepalive"`
	Timeout              time.Duration `toml:"timeout"`
	UseExternalAddr      bool          `toml:"use_external_addr"`
}

// Settings returns the fleeting settings for Init, reading key_path.
func (c ConnectorConfig) Settings() (fleeting.Settings, error) {
	s := fleeting.Settings{ConnectorConfig: fleeting.ConnectorConfig{
		OS: c.OS, Arch: c.Arch, Protocol: fleeting.Protocol(c.Protocol), ProtocolPort: c.ProtocolPort,
		Username: c.Username, Password: c.Password, UseStaticCredentials: c.UseStaticCredentials,
		Keepalive: c.Keepalive, Timeout: c.Timeout,
	}}
	if c.KeyPath != "" {
		key, err := os.ReadFile(c.KeyPath)
		if err != nil {
			return s, fmt.Errorf("connector_config.key_path: %w", err)
		}
		s.Key = key
	}
	return s, nil
}

// ScaleThrottle is [runners.autoscaler.scale_throttle]: a token bucket on
// new instances.
type ScaleThrottle struct {
	// Limit is new instances per second (0: 100; -1: unlimited).
	Limit float64 `toml:"limit"`
	// Burst is the bucket size (0: max_instances, or Limit if that is 0).
	Burst int `toml:"burst"`
}

// StateStorage is [runners.autoscaler.state_storage].
type StateStorage struct {
	Enabled bool `toml:"enabled"`
	// Dir holds one subdirectory per scaler (Options.Name) with its
	// ledger, and the group leases. Default ".taskscaler"; the runner
	// resolves it beside config.toml.
	Dir string `toml:"dir"`
	// KeepInstanceWithAcquisitions adopts, after a restart, instances that
	// had jobs when the previous process stopped; otherwise they are
	// removed (their jobs died with that process and may have left
	// anything behind).
	KeepInstanceWithAcquisitions bool `toml:"keep_instance_with_acquisitions"`
	// LeaseDuration is how long the group lease lasts without renewal
	// (Berth; default 1m).
	LeaseDuration time.Duration `toml:"lease_duration"`
}

// Policy is one [[runners.autoscaler.policy]].
type Policy struct {
	// Periods are 5-field cron expressions; the policy applies during any
	// minute one matches. Default ["* * * * *"].
	Periods []string `toml:"periods"`
	// Timezone is the IANA zone of Periods (default: the scaler's default
	// location, the local zone unless Options say otherwise).
	Timezone string `toml:"timezone"`
	// IdleCount is how many idle job slots (not instances) to keep.
	IdleCount int `toml:"idle_count"`
	// IdleTime is how long an instance with no job stays before it may be
	// removed (at least 1s; default 5m).
	IdleTime time.Duration `toml:"idle_time"`
	// ScaleFactor keeps ScaleFactor × in-use slots idle when that is more
	// than IdleCount, capped at ScaleFactorLimit (0: no cap).
	ScaleFactor      float64 `toml:"scale_factor"`
	ScaleFactorLimit int     `toml:"scale_factor_limit"`
	// PreemptiveMode: Reserve succeeds only when a ready idle slot exists.
	// Unset: true iff IdleCount > 0.
	PreemptiveMode *bool `toml:"preemptive_mode"`

	schedules []cron.Schedule
	loc       *time.Location
}

// PredictionOn is Prediction with its default (on) applied.
func (c *Config) PredictionOn() bool { return c.Prediction == nil || *c.Prediction }

// Spare is PredictionSpare as the forecast's choice.
func (c *Config) Spare() (forecast.Spare, error) {
	switch c.PredictionSpare {
	case "", "poisson":
		return forecast.SparePoisson, nil
	case "measured":
		return forecast.SpareMeasured, nil
	}
	return 0, fmt.Errorf("%q is not poisson or measured", c.PredictionSpare)
}

// PackingOn is Packing with its default (as Prediction) applied.
func (c *Config) PackingOn() bool {
	if c.Packing != nil {
		return *c.Packing
	}
	return c.PredictionOn()
}

// Preemptive is PreemptiveMode with its default applied.
func (p Policy) Preemptive() bool {
	if p.PreemptiveMode != nil {
		return *p.PreemptiveMode
	}
	return p.IdleCount > 0
}

// DefaultPolicy applies when no policy's period matches: no idle slots,
// idle instances removed after 5m.
var DefaultPolicy = Policy{Periods: []string{"* * * * *"}, IdleTime: DefaultIdleTime}

// compile parses the periods and loads the zone; def is the zone for an
// empty Timezone.
func (p *Policy) compile(def *time.Location) error {
	if len(p.Periods) == 0 {
		p.Periods = []string{"* * * * *"}
	}
	p.schedules = p.schedules[:0]
	for _, e := range p.Periods {
		s, err := cron.Parse(e)
		if err != nil {
			return fmt.Errorf("periods: %w", err)
		}
		p.schedules = append(p.schedules, s)
	}
	p.loc = def
	if p.Timezone != "" {
		loc, err := time.LoadLocation(p.Timezone)
		if err != nil {
			return fmt.Errorf("timezone: %w", err)
		}
		p.loc = loc
	}
	if p.loc == nil {
		p.loc = time.Local
	}
	return nil
}

// matches reports whether a compiled policy applies at now.
func (p *Policy) matches(now time.Time) bool {
	t := now.In(p.loc)
	for _, s := range p.schedules {
		if s.Match(t) {
			return true
		}
	}
	return false
}

func (p *Policy) setDefaults() {
	if p.IdleTime == 0 {
		p.IdleTime = DefaultIdleTime
	}
	if p.IdleTime > 0 && p.IdleTime < MinIdleTime {
		p.IdleTime = MinIdleTime
	}
}

func (p Policy) validate() error {
	var errs []error
	if p.IdleCount < 0 {
		errs = append(errs, errors.New("idle_count: negative"))
	}
	if p.IdleTime < 0 {
		errs = append(errs, errors.New("idle_time: negative"))
	}
	if p.ScaleFactor < 0 || math.IsNaN(p.ScaleFactor) || math.IsInf(p.ScaleFactor, 0) {
		errs = append(errs, errors.New("scale_factor: must be a finite number ≥ 0"))
	}
	if p.ScaleFactorLimit < 0 {
		errs = append(errs, errors.New("scale_factor_limit: negative"))
	}
	for _, e := range p.Periods {
		if _, err := cron.Parse(e); err != nil {
			errs = append(errs, fmt.Errorf("periods: %w", err))
		}
	}
	if p.Timezone != "" {
		if _, err := time.LoadLocation(p.Timezone); err != nil {
			errs = append(errs, fmt.Errorf("timezone: %w", err))
		}
	}
	return errors.Join(errs...)
}

// SetDefaults fills absent keys with their defaults.
func (c *Config) SetDefaults() {
	if c.CapacityPerInstance <= 0 {
		c.CapacityPerInstance = DefaultCapacityPerInstance
	}
	setDur := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	setDur(&c.InstanceAcquireTimeout, DefaultInstanceAcquireTimeout)
	setDur(&c.UpdateInterval, DefaultUpdateInterval)
	setDur(&c.UpdateIntervalWhenExpecting, DefaultUpdateIntervalWhenExpecting)
	setDur(&c.DeletionRetryInterval, DefaultDeletionRetryInterval)
	setDur(&c.ShutdownDeletionInterval, DefaultShutdownDeletionInterval)
	setDur(&c.InstanceReadyTimeout, DefaultInstanceReadyTimeout)
	setDur(&c.InstanceCreatingTimeout, DefaultInstanceCreatingTimeout)
	setDur(&c.StateStorage.LeaseDuration, DefaultLeaseDuration)
	if c.ShutdownDeletionRetries <= 0 {
		c.ShutdownDeletionRetries = DefaultShutdownDeletionRetries
	}
	if c.FailureThreshold <= 0 {
		c.FailureThreshold = DefaultFailureThreshold
	}
	if c.InstanceReadyRetries == 0 {
		c.InstanceReadyRetries = DefaultInstanceReadyRetries
	}
	if c.ScaleThrottle.Limit == 0 {
		c.ScaleThrottle.Limit = DefaultScaleThrottleLimit
	}
	if c.ScaleThrottle.Burst <= 0 {
		c.ScaleThrottle.Burst = c.MaxInstances
		if c.ScaleThrottle.Burst <= 0 {
			c.ScaleThrottle.Burst = int(math.Max(1, math.Ceil(c.ScaleThrottle.Limit)))
		}
	}
	if c.StateStorage.Dir == "" {
		c.StateStorage.Dir = DefaultStateStorageDir
	}
	for i := range c.Policies {
		c.Policies[i].setDefaults()
	}
}

// Validate checks the configuration after SetDefaults. Errors name the key.
func (c *Config) Validate() error {
	var errs []error
	add := func(key string, err error) { errs = append(errs, fmt.Errorf("runners.autoscaler.%s: %w", key, err)) }
	if c.MaxUseCount < 0 {
		add("max_use_count", errors.New("negative"))
	}
	if c.MaxInstances < 0 {
		add("max_instances", errors.New("negative"))
	}
	if c.InstanceReadyRetries < -1 {
		add("instance_ready_retries", errors.New("below -1"))
	}
	if l := c.ScaleThrottle.Limit; (l < 0 && l != -1) || math.IsNaN(l) || math.IsInf(l, 0) {
		add("scale_throttle.limit", errors.New("must be ≥ 0, or -1 for unlimited"))
	}
	if c.ScaleThrottle.Burst < 0 {
		add("scale_throttle.burst", errors.New("negative"))
	}
	switch c.ConnectorConfig.Protocol {
	case "", "ssh", "winrm", "winrm+https":
	default:
		add("connector_config.protocol", fmt.Errorf("%q is not ssh, winrm or winrm+https", c.ConnectorConfig.Protocol))
	}
	if _, err := c.Spare(); err != nil {
		add("prediction_spare", err)
	}
	for i, p := range c.Policies {
		if err := p.validate(); err != nil {
			add(fmt.Sprintf("policy[%d]", i), err)
		}
	}
	return errors.Join(errs...)
}

// DecodeConfig decodes a [runners.autoscaler] table given as TOML text (the
// table's body, keys at the top level), applies defaults and validates it.
// Keys it does not know are returned, by full name, for the caller to warn
// about.
func DecodeConfig(text string) (Config, []string, error) {
	var c Config
	md, err := toml.Decode(text, &c)
	if err != nil {
		return Config{}, nil, fmt.Errorf("runners.autoscaler: %w", err)
	}
	var unknown []string
	for _, k := range md.Undecoded() {
		if len(k) > 0 && (k[0] == "plugin_config" || k[0] == "vm_isolation") {
			continue // free-form tables
		}
		unknown = append(unknown, "runners.autoscaler."+k.String())
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, unknown, err
	}
	return c, unknown, nil
}
