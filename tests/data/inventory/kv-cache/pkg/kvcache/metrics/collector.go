package metrics

import "github.com/prometheus/client_golang/prometheus"

var (
	Admissions = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "kvcache", Subsystem: "index", Name: "admissions_total",
		Help: "Total number of KV-block admissions",
	})
	TokenizationLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "kvcache", Subsystem: "tokenization", Name: "tokenization_latency_seconds",
		Help:    "Latency of Tokenization calls in seconds",
		Buckets: prometheus.DefBuckets,
	}, []string{"tokenizer"})
)
