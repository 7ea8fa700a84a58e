package logging

import (
	"flag"

	"github.com/spf13/pflag"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

const DEFAULT = 2

type LoggingOptions struct {
	LogVerbosity int
	ZapOptions   zap.Options
}

func NewOptions() *LoggingOptions {
	return &LoggingOptions{
		LogVerbosity: DEFAULT,
		ZapOptions:   zap.Options{Development: true},
	}
}

func (opts *LoggingOptions) AddFlags(fs *pflag.FlagSet) {
	fs.IntVarP(&opts.LogVerbosity, "v", "v", opts.LogVerbosity, "Number for the log level verbosity.")
	gofs := flag.NewFlagSet("zap", flag.ExitOnError)
	opts.ZapOptions.BindFlags(gofs)
	fs.AddGoFlagSet(gofs)
}
