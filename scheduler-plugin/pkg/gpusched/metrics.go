package gpusched

import (
	"context"
	"path"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// rpcBuckets bound one RPC round trip in seconds: 0.1 ms steps up to 5 ms, where a PreFilter
// answer lives and its 2 ms target sits on a bound (issue 18), then doubling from 10 ms to the
// 5 s default deadline. Bounds are i/10000 rather than a running sum, so 0.002 is exactly 2 ms.
var rpcBuckets = func() []float64 {
	fine := make([]float64, 0, 50)
	for i := 1; i <= 50; i++ {
		fine = append(fine, float64(i)/10000)
	}
	return metrics.MergeBuckets(fine, metrics.ExponentialBuckets(0.01, 2, 10))
}()

// rpcDuration is every RPC the plugin makes to the core, timed around the whole call as the
// plugin sees it (encoding, the socket both ways, the core's work, decoding). kube-scheduler
// serves it on its own /metrics: the legacy registry is the one that endpoint gathers.
var rpcDuration = metrics.NewHistogramVec(&metrics.HistogramOpts{
	Namespace:      "gpusched",
	Subsystem:      "plugin",
	Name:           "rpc_duration_seconds",
	Help:           "Round trips of the GpuSched plugin's RPCs to the gpusched core, by RPC (PreFilter, Reserve, ...) and gRPC status code.",
	Buckets:        rpcBuckets,
	StabilityLevel: metrics.ALPHA,
}, []string{"rpc", "code"})

// answersTotal counts PreFilter answers by who gave them: "plugin" (from the
// core's cacheable answers for the pod's spec, no round trip) or "core" (asked).
var answersTotal = metrics.NewCounterVec(&metrics.CounterOpts{
	Namespace:      "gpusched",
	Subsystem:      "plugin",
	Name:           "prefilter_answers_total",
	Help:           "PreFilter answers by source: plugin (from the core's cacheable answers for the pod's spec) or core (asked over RPC).",
	StabilityLevel: metrics.ALPHA,
}, []string{"source"})

func init() {
	legacyregistry.MustRegister(rpcDuration, answersTotal)
}

// observeRPC is the client connection's unary interceptor (dial): every RPC, Hello included,
// passes through it, and its label is the method's last path element as gRPC names it.
func observeRPC(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	start := time.Now()
	err := invoker(ctx, method, req, reply, cc, opts...)
	rpcDuration.WithLabelValues(path.Base(method), status.Code(err).String()).Observe(time.Since(start).Seconds())
	return err
}
