package gpusched

import (
	"context"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

func gpuPod(name string, gpus int64, node string) *v1.Pod {
	return podRequesting(name, "nvidia.com/gpu", gpus, node)
}

func podRequesting(name string, res v1.ResourceName, count int64, node string) *v1.Pod {
	pod := makePod(name)
	pod.Spec.NodeName = node
	requests := v1.ResourceList{}
	if count > 0 {
		requests[res] = *resource.NewQuantity(count, resource.DecimalSI)
	}
	pod.Spec.Containers = []v1.Container{{Name: "vllm", Resources: v1.ResourceRequirements{Requests: requests}}}
	return pod
}

func TestDeletedPodsRequeueOnlyWhenTheyHeldGPUs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		deleted interface{}
		want    fwk.QueueingHint
	}{
		{"a GPU pod", gpuPod("engine", 2, "a"), fwk.Queue},
		{"a GPU sharer", podRequesting("small", "gpusched.io/gpu-share", 1, "a"), fwk.Queue},
		{"a DRA pod (the marker)", podRequesting("dra", "gpusched.io/dra", 1, "a"), fwk.Queue},
		{"a CPU pod", gpuPod("web", 0, "a"), fwk.QueueSkip},
		{"a tombstone", cache.DeletedFinalStateUnknown{Key: "ns/x"}, fwk.Queue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := gpuPodDeleted(klog.Background(), makePod("waiting"), tc.deleted, nil)
			if err != nil || got != tc.want {
				t.Fatalf("hint = %v %v, want %v", got, err, tc.want)
			}
		})
	}
}

// recordingActivator is an activator over a lister of the given pods that records what it activated.
type recordingActivator struct {
	mu        sync.Mutex
	activated [][]string
}

func (r *recordingActivator) activator(t *testing.T, pods ...*v1.Pod) activator {
	t.Helper()
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, pod := range pods {
		if err := indexer.Add(pod); err != nil {
			t.Fatal(err)
		}
	}
	return activator{pods: corelisters.NewPodLister(indexer), activate: func(_ klog.Logger, batch map[string]*v1.Pod) {
		r.mu.Lock()
		defer r.mu.Unlock()
		var keys []string
		for key := range batch {
			keys = append(keys, key)
		}
		r.activated = append(r.activated, keys)
	}}
}

func (r *recordingActivator) batches() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.activated...)
}

// streamingCore streams each batch sent on its channel, then ends the stream when told.
type streamingCore struct {
	fakeCore
	batches chan *pb.RequeueBatch
	opened  chan struct{}
}

func (s *streamingCore) WatchRequeue(_ *pb.WatchRequeueRequest, stream pb.Scheduling_WatchRequeueServer) error {
	s.opened <- struct{}{}
	for batch := range s.batches {
		if batch == nil {
			return nil // the core restarting: the plugin must reopen
		}
		if err := stream.Send(batch); err != nil {
			return err
		}
	}
	return nil
}

func TestTheRequeueStreamActivatesThePendingPodsItNamesAndIsReopened(t *testing.T) {
	core := &streamingCore{batches: make(chan *pb.RequeueBatch), opened: make(chan struct{}, 4)}
	p, _ := start(t, core, time.Second)
	rec := &recordingActivator{}
	a := rec.activator(t, gpuPod("pending", 2, ""), gpuPod("bound", 2, "node-a"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.core.watchRequeue(ctx, a)

	<-core.opened
	core.batches <- &pb.RequeueBatch{Pods: []string{"ns/pending", "ns/bound", "ns/gone", "malformed"}, Reason: "GPU capacity rose on node-a"}
	core.batches <- nil // stream ends
	select {
	case <-core.opened: // reopened
	case <-time.After(5 * time.Second):
		t.Fatal("the plugin did not reopen the requeue stream")
	}
	core.batches <- &pb.RequeueBatch{Pods: []string{"ns/pending"}, Reason: "gang ns/g planned"}
	deadline := time.Now().Add(5 * time.Second)
	for len(rec.batches()) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := rec.batches()
	if len(got) != 2 || len(got[0]) != 1 || got[0][0] != "ns/pending" || len(got[1]) != 1 || got[1][0] != "ns/pending" {
		t.Fatalf("activated %v, want [[ns/pending] [ns/pending]]: only pending pods the lister knows", got)
	}
}
