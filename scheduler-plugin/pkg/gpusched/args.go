package gpusched

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
)

// DefaultTimeout is the deadline of one RPC to the core when the args name none. A PreFilter
// answer takes the core milliseconds; seconds means it is stuck, and the pod is better retried.
const DefaultTimeout = 5 * time.Second

// DefaultConfirmLinger is how long the plugin gathers the reservations it took itself before the
// core confirms them in one call (confirm.go) when the args name none. Confirmation is off the
// scheduling cycle; what it delays is each pod's Bind, by at most this.
const DefaultConfirmLinger = 50 * time.Millisecond

// maxConfirmLinger bounds args.confirmLinger: a pod's Bind waits this long at most for it.
const maxConfirmLinger = time.Second

// DefaultNarrowFromNodes is the table size from which PreFilter names the nodes a GPU pod can use
// (its PreFilterResult) when the args name none: below it, kube-scheduler's message keeps
// gpusched's reason for every node, which matters more than microseconds per node.
const DefaultNarrowFromNodes = 1000

// Args are GpuSched's pluginConfig args in a KubeSchedulerConfiguration:
//
//	pluginConfig:
//	- name: GpuSched
//	  args:
//	    address: unix:///run/gpusched/scheduling.sock
//	    timeout: 5s
//	    answerMaxAge: 1s
//	    confirmLinger: 50ms
//	    narrowFromNodes: 1000
type Args struct {
	metav1.TypeMeta `json:",inline"`
	// Address of the gpusched core's gpusched.scheduling.v1 service: unix:///path (the shipped
	// setup, a socket in a volume shared with the extender container) or host:port.
	Address string `json:"address"`
	// Timeout is the deadline of each RPC (PreFilter, Reserve, Unreserve); DefaultTimeout if unset.
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// AnswerMaxAge is how long the node groups the core last named may answer PreFilter for a pod
	// spec the core has judged, without asking it (see answerCache); DefaultAnswerMaxAge if unset,
	// 0s to ask the core for every pod.
	AnswerMaxAge *metav1.Duration `json:"answerMaxAge,omitempty"`
	// AnswerAudit asks the core too for every PreFilter the cache answered, and compares the two
	// node by node (gpusched_plugin_answer_audits_total{result}; a difference is logged at V(2)).
	// It costs the round trip the cache saves: for tests and canaries, not for throughput.
	AnswerAudit bool `json:"answerAudit,omitempty"`
	// ConfirmLinger is how long the reservations the plugin took itself (pods answered from the
	// cache) gather before the core confirms them in one ReserveBatch; DefaultConfirmLinger if
	// unset, 0s to send each at once (a batch then holds what queued while the last was sent).
	// The core's CPU per pod falls with the batch's size; each pod's Bind waits at most this long.
	ConfirmLinger *metav1.Duration `json:"confirmLinger,omitempty"`
	// NarrowFromNodes: with at least this many nodes in the core's table, PreFilter returns the
	// nodes a GPU pod can use as its PreFilterResult — those the core judged to fit now or once
	// pods leave (preemption's candidates), never a node that could fit — so kube-scheduler
	// filters and scores only those. kube-scheduler then counts every other node as "didn't
	// satisfy plugin(s) [GpuSched]" in the pod's status (the reasons stay in gpusched explain).
	// DefaultNarrowFromNodes if unset; 0 narrows at every size.
	NarrowFromNodes *int `json:"narrowFromNodes,omitempty"`
}

// decodeArgs reads the args as kube-scheduler hands an out-of-tree plugin's: *runtime.Unknown
// holding the JSON (or YAML) of the pluginConfig entry; *Args is accepted too (tests, callers that
// build the framework in code). Defaults are filled in and every field is checked, with its path
// in the message, so a bad config stops the scheduler at startup.
func decodeArgs(obj runtime.Object) (Args, error) {
	var args Args
	switch a := obj.(type) {
	case nil:
	case *Args:
		args = *a
	default:
		if err := frameworkruntime.DecodeInto(obj, &args); err != nil {
			return Args{}, fmt.Errorf("pluginConfig[%s].args: %w", Name, err)
		}
	}
	if args.Timeout == nil {
		args.Timeout = &metav1.Duration{Duration: DefaultTimeout}
	}
	if args.AnswerMaxAge == nil {
		args.AnswerMaxAge = &metav1.Duration{Duration: DefaultAnswerMaxAge}
	}
	if args.ConfirmLinger == nil {
		args.ConfirmLinger = &metav1.Duration{Duration: DefaultConfirmLinger}
	}
	if args.NarrowFromNodes == nil {
		n := DefaultNarrowFromNodes
		args.NarrowFromNodes = &n
	}
	if args.Address == "" {
		return Args{}, fmt.Errorf("pluginConfig[%s].args.address: required (e.g. unix:///run/gpusched/scheduling.sock)", Name)
	}
	if strings.HasPrefix(args.Address, "unix:") && strings.TrimLeft(strings.TrimPrefix(args.Address, "unix:"), "/") == "" {
		return Args{}, fmt.Errorf("pluginConfig[%s].args.address: %q names no socket path", Name, args.Address)
	}
	if args.Timeout.Duration <= 0 {
		return Args{}, fmt.Errorf("pluginConfig[%s].args.timeout: must be > 0, got %s", Name, args.Timeout.Duration)
	}
	if args.AnswerMaxAge.Duration < 0 {
		return Args{}, fmt.Errorf("pluginConfig[%s].args.answerMaxAge: must be >= 0 (0s: always ask the core), got %s",
			Name, args.AnswerMaxAge.Duration)
	}
	if l := args.ConfirmLinger.Duration; l < 0 || l > maxConfirmLinger {
		return Args{}, fmt.Errorf("pluginConfig[%s].args.confirmLinger: must be between 0s (send at once) and %s "+
			"(each pod's Bind waits this long at most), got %s", Name, maxConfirmLinger, l)
	}
	if *args.NarrowFromNodes < 0 {
		return Args{}, fmt.Errorf("pluginConfig[%s].args.narrowFromNodes: must be >= 0 (0: at every size), got %d",
			Name, *args.NarrowFromNodes)
	}
	return args, nil
}

// DeepCopyObject makes *Args a runtime.Object (what a plugin factory receives); TypeMeta gives
// it GetObjectKind.
func (a *Args) DeepCopyObject() runtime.Object {
	c := *a
	if a.Timeout != nil {
		t := *a.Timeout
		c.Timeout = &t
	}
	if a.AnswerMaxAge != nil {
		m := *a.AnswerMaxAge
		c.AnswerMaxAge = &m
	}
	if a.ConfirmLinger != nil {
		l := *a.ConfirmLinger
		c.ConfirmLinger = &l
	}
	if a.NarrowFromNodes != nil {
		n := *a.NarrowFromNodes
		c.NarrowFromNodes = &n
	}
	return &c
}
