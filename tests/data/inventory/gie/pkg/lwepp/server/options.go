package server

import "github.com/spf13/pflag"

type Options struct {
	GRPCPort int
	PoolName string
}

func NewOptions() *Options {
	return &Options{GRPCPort: 9002}
}

func (opts *Options) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&opts.GRPCPort, "grpc-port", opts.GRPCPort, "gRPC port.")
	fs.StringVar(&opts.PoolName, "lwepp-pool", opts.PoolName, "Name of the InferencePool.")
}
