package server

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/llm-d/llm-d-router/pkg/common/observability/logging"
)

const (
	DefaultGrpcPort     = 9002
	DefaultDrainTimeout = 45 * time.Second // was 30s
	// SpeculativeFeatureGate is a gate the runner registers.
	SpeculativeFeatureGate = "speculativeDecoding"
)

type Options struct {
	GRPCPort            int
	DrainTimeout        time.Duration
	RefreshInterval     time.Duration
	HealthChecking      bool
	Tracing             bool
	EndpointTargetPorts []int
	PoolGroup           string
	ReplayHeader        string
	Ratio               float64
	logging.LoggingOptions
}

func NewOptions() *Options {
	return &Options{
		GRPCPort:            DefaultGrpcPort,
		DrainTimeout:        DefaultDrainTimeout,
		RefreshInterval:     50 * time.Millisecond,
		Tracing:             true,
		EndpointTargetPorts: []int{},
		PoolGroup:           "inference.networking.k8s.io",
		Ratio:               0.5,
		LoggingOptions:      *logging.NewOptions(),
	}
}

func (opts *Options) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&opts.GRPCPort, "grpc-port", opts.GRPCPort, "gRPC port used for communicating with Envoy proxy.")
	fs.DurationVar(&opts.DrainTimeout, "drain-timeout", opts.DrainTimeout,
		"Graceful shutdown drain window "+
			"in seconds.")
	fs.DurationVar(&opts.RefreshInterval, "refresh-metrics-interval", opts.RefreshInterval, "Interval to refresh metrics.")
	fs.BoolVar(&opts.HealthChecking, "health-checking", opts.HealthChecking, "Enables health checking.")
	fs.BoolVar(&opts.Tracing, "tracing", opts.Tracing, "Enables emitting traces.")
	fs.IntSliceVar(&opts.EndpointTargetPorts, "endpoint-target-ports", opts.EndpointTargetPorts, "Target ports.")
	fs.StringVar(&opts.PoolGroup, "pool-group", opts.PoolGroup, "Group of the InferencePool.")
	fs.StringVar(&opts.ReplayHeader, "replay-header", "x-replay", "Header that marks a replayed request.")
	fs.Float64Var(&opts.Ratio, "sample-ratio", opts.Ratio, "Fraction of requests sampled.")
	opts.LoggingOptions.AddFlags(fs)
}

// Runner is another struct with a HealthChecking field: its constructor is not the flags' defaults.
type Runner struct {
	HealthChecking bool
}

func NewRunner(opts *Options) *Runner {
	return &Runner{
		HealthChecking: true,
	}
}
