package gpusched

import (
	"context"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// gpuResources are the extended resources gpusched judges: whole GPUs, shares of one GPU, and the
// marker a DRA pod carries (its GPUs come through a ResourceClaim; a deleted one frees them too).
var gpuResources = []v1.ResourceName{"nvidia.com/gpu", "gpusched.io/gpu-share", "gpusched.io/dra"}

// EventsToRegister says which cluster events may make a pod GpuSched rejected fit, so
// kube-scheduler requeues it on those alone: a node added, a node's allocatable or labels changed,
// an assigned GPU pod deleted (its GPUs freed). What only the core sees — GPU memory freed by a
// foreign process, a gang's sibling or PodGroup arriving — comes over the core's requeue stream
// instead (watchRequeue), which activates the pods directly: no annotation patch, no event.
func (p *Plugin) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return []fwk.ClusterEventWithHint{
		{Event: fwk.ClusterEvent{Resource: fwk.Node, ActionType: fwk.Add | fwk.UpdateNodeAllocatable | fwk.UpdateNodeLabel}},
		{Event: fwk.ClusterEvent{Resource: fwk.AssignedPod, ActionType: fwk.Delete}, QueueingHintFn: gpuPodDeleted},
	}, nil
}

// gpuPodDeleted queues a rejected pod when the deleted pod held GPUs or a share; any other deletion frees
// nothing GpuSched judged.
func gpuPodDeleted(logger klog.Logger, _ *v1.Pod, oldObj, _ interface{}) (fwk.QueueingHint, error) {
	deleted, ok := oldObj.(*v1.Pod)
	if !ok {
		return fwk.Queue, nil // a tombstone or an unexpected type: requeue rather than strand the pod
	}
	if requestsGPUs(deleted) {
		logger.V(5).Info("a GPU pod was deleted; requeueing", "deleted", klog.KObj(deleted))
		return fwk.Queue, nil
	}
	return fwk.QueueSkip, nil
}

func requestsGPUs(pod *v1.Pod) bool {
	for _, containers := range [][]v1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for _, c := range containers {
			for _, list := range []v1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
				for _, name := range gpuResources {
					if q, ok := list[name]; ok && q.Cmp(resource.Quantity{}) > 0 {
						return true
					}
				}
			}
		}
	}
	return false
}

// activator is what watchRequeue needs of the framework: the pods it knows, and its queue.
type activator struct {
	pods     corelisters.PodLister
	activate func(klog.Logger, map[string]*v1.Pod)
}

// watchRequeue keeps the core's requeue stream open for the plugin's lifetime and activates the
// pods each batch names (those still pending in kube-scheduler's queue; the rest are ignored by
// Activate). A broken stream is reopened with a backoff of 0.5 s doubling to 10 s.
func (c *core) watchRequeue(ctx context.Context, a activator) {
	logger := klog.FromContext(ctx).WithValues("plugin", Name, "address", c.address)
	for wait := 500 * time.Millisecond; ctx.Err() == nil; wait = min(2*wait, 10*time.Second) {
		stream, err := c.client.WatchRequeue(ctx, &pb.WatchRequeueRequest{ApiVersion: APIVersion, PluginVersion: PluginVersion})
		for err == nil {
			var batch *pb.RequeueBatch
			if batch, err = stream.Recv(); err == nil {
				wait = 500 * time.Millisecond
				c.answers.forget() // capacity came back in the core's view: the cache's groups are behind
				a.activateBatch(logger, batch)
			}
		}
		if ctx.Err() != nil {
			return
		}
		logger.V(2).Info("gpusched requeue stream ended; reopening", "err", err.Error(), "retryIn", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

func (a activator) activateBatch(logger klog.Logger, batch *pb.RequeueBatch) {
	pods := make(map[string]*v1.Pod, len(batch.GetPods()))
	for _, key := range batch.GetPods() {
		namespace, name, ok := strings.Cut(key, "/")
		if !ok {
			continue
		}
		if pod, err := a.pods.Pods(namespace).Get(name); err == nil && pod.Spec.NodeName == "" {
			pods[key] = pod
		}
	}
	if len(pods) == 0 {
		return
	}
	logger.V(2).Info("gpusched requeued pods", "count", len(pods), "reason", batch.GetReason())
	a.activate(logger, pods)
}
