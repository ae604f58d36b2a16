package gpusched

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// APIVersion is the gpusched.scheduling API version this plugin speaks (the core refuses others).
const APIVersion = 1

// PluginVersion is reported to the core in Hello (its logs name the plugin it serves).
const PluginVersion = "0.1.0"

// maxMessageBytes matches the core's limit (a frame's payload): a pod's JSON is KiBs, a
// 5,000-node table ~100 KiB.
const maxMessageBytes = 8 << 20

// nodeTable is the core's node table as the plugin holds it: immutable once built, swapped whole.
// Every per-node vector of a PreFilter answer is indexed by the table of its generation.
type nodeTable struct {
	generation uint64
	names      []string
	index      map[string]int // name -> position in names
}

func newNodeTable(t *pb.NodeTable) *nodeTable {
	index := make(map[string]int, len(t.GetNames()))
	for i, name := range t.GetNames() {
		index[name] = i
	}
	return &nodeTable{generation: t.GetGeneration(), names: t.GetNames(), index: index}
}

// core is the plugin's side of the service: the connection, the deadline, and the node table
// last received (under mu; kube-scheduler runs one scheduling cycle at a time, but Unreserve and
// Bind run on binding goroutines, so nothing here assumes a single caller).
type core struct {
	address  string
	timeout  time.Duration
	client   schedulingClient
	answers  *answerCache // the core's cacheable answers, by pod spec and node group
	confirms *confirmer   // the plugin's own reservations on their way to the core (confirm.go)
	audit    bool         // args.answerAudit: every answer of the cache checked against the core's

	prefetching atomic.Bool // a prefetch is asking the core (prefetch)

	mu    sync.Mutex
	table *nodeTable // nil until the first PreFilter answer
}

// newCore: answerMaxAge is how long the core's groups may answer PreFilter without asking it (0:
// always ask; see answerCache); audit asks the core as well whenever they do, and compares
// (auditAnswer); linger is how long the plugin's own reservations gather before the core confirms
// them (confirmer). The client connects on each call's need and reconnects by itself, so a core
// that starts after kube-scheduler (or restarts) is simply reached later.
func newCore(address string, timeout, answerMaxAge, linger time.Duration, audit bool, client schedulingClient) *core {
	c := &core{address: address, timeout: timeout, client: client, audit: audit,
		answers: newAnswerCache(answerMaxAge, time.Now)}
	c.confirms = &confirmer{send: c.confirmBatch, linger: linger}
	return c
}

// hello greets the core until it answers, logging what it says; it never stops the scheduler (the
// core may start later, and every request names its API version, so a skew still surfaces in the
// pods' statuses). It returns when ctx ends, the core answered, or the core refused our version.
func (c *core) hello(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("plugin", Name, "address", c.address)
	for wait := 500 * time.Millisecond; ; wait = min(2*wait, 30*time.Second) {
		rctx, cancel := context.WithTimeout(ctx, c.timeout)
		reply, err := c.client.Hello(rctx, &pb.HelloRequest{ApiVersion: APIVersion, PluginVersion: PluginVersion})
		cancel()
		switch {
		case err == nil:
			logger.Info("gpusched core answered", "coreVersion", reply.GetCoreVersion(), "apiVersion", reply.GetApiVersion(),
				"ready", reply.GetReady(), "notReadyReason", reply.GetNotReadyReason())
			return
		case status.Code(err) == codes.FailedPrecondition:
			logger.Error(err, "gpusched core refuses this plugin's API version; GPU pods stay pending until plugin and core are of one release")
			return
		default:
			logger.Info("gpusched core not reachable yet; retrying", "err", err.Error(), "retryIn", wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// heldTable is the table PreFilter answers are currently indexed by.
func (c *core) heldTable() *nodeTable {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.table
}

// adopt takes the table of an answer: the one it carries, or the one held when it is of the
// answer's generation. Nil when neither (the core answered for a table we do not hold).
func (c *core) adopt(reply *pb.PreFilterReply) *nodeTable {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := reply.GetTable(); t != nil && t.GetGeneration() == reply.GetTableGeneration() {
		if c.table == nil || c.table.generation != t.GetGeneration() {
			c.table = newNodeTable(t)
		}
		return c.table
	}
	if c.table != nil && c.table.generation == reply.GetTableGeneration() {
		return c.table
	}
	return nil
}

// preFilter returns the core's answer for the pod against every node it knows (as an answer, with
// the table its vectors are indexed by: nil for skip/error/unresolvable answers, which have none),
// and whether the plugin answered it from the core's cacheable answers for the pod's spec
// (answerCache) instead of asking. Nodes the plugin reserved on and the core has not confirmed are
// answered by the cache either way (answerCache.overlay).
func (c *core) preFilter(ctx context.Context, pod *v1.Pod) (*answer, error) {
	key, keyErr := specKey(pod) // a spec that cannot be encoded is only never answered from the cache
	if keyErr == nil {
		c.answers.noteSpec(key, pod)
	}
	if keyErr == nil && !c.answers.mustAsk(pod.UID) {
		table := c.heldTable()
		source := "plugin"
		reply, ok := c.answers.answer(key, table)
		if !ok && c.judgeGroups(ctx, pod, key, table) {
			source = "judged"
			reply, ok = c.answers.answer(key, table)
		}
		if ok {
			answersTotal.WithLabelValues(source).Inc()
			if c.audit {
				c.auditAnswer(ctx, pod, reply, table)
			}
			if reply.GetSkip() {
				return &answer{reply: reply, fromCache: true}, nil // a skip has no table, as the core's own
			}
			return &answer{reply: reply, table: table, fromCache: true, key: key}, nil
		}
	}
	answersTotal.WithLabelValues("core").Inc()
	reply, table, err := c.askPreFilter(ctx, pod)
	if err != nil {
		return nil, err
	}
	if (table != nil || reply.GetSkip()) && keyErr == nil {
		c.answers.learn(key, reply)
		c.answers.overlay(key, reply, table)
	}
	return &answer{reply: reply, table: table}, nil
}

// judgeGroups asks the core for the answers the cache lacks for key's spec on table (answerCache.
// unjudged: groups telemetry moved nodes into), one node per group, and keeps them; false when
// there were none to ask for, or the core did not judge them (the caller asks the whole cycle).
func (c *core) judgeGroups(ctx context.Context, pod *v1.Pod, key string, table *nodeTable) bool {
	positions := c.answers.unjudged(key, table)
	return len(positions) > 0 && c.askJudged(ctx, pod, key, table, positions)
}

// askJudged asks JudgeGroups for key's spec (pod one of it) on the nodes at positions of table and
// keeps the answers; false when the core was not reached or did not judge them.
func (c *core) askJudged(ctx context.Context, pod *v1.Pod, key string, table *nodeTable, positions []uint32) bool {
	wire, err := wirePod(pod)
	if err != nil {
		return false
	}
	reply, err := call(ctx, c, func(ctx context.Context) (*pb.JudgeGroupsReply, error) {
		return c.client.JudgeGroups(ctx, &pb.JudgeGroupsRequest{ApiVersion: APIVersion, Pod: wire,
			TableGeneration: table.generation, Positions: positions})
	})
	return err == nil && c.answers.learnJudged(key, len(positions), reply)
}

// prefetch asks the core, off the scheduling cycle, for the groups the specs scheduled lately lack
// in the groups just renewed (telemetry moved nodes into groups never judged for them) or hold no
// move for, so that their next pods are answered, and reserved, without a round trip. One prefetch
// at a time, asking again until nothing is lacking (renewals that arrive meanwhile start none);
// a PreFilter that still lacks groups asks them itself.
func (c *core) prefetch() {
	if !c.prefetching.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer c.prefetching.Store(false)
		for range maxPrefetchRounds {
			table := c.heldTable()
			jobs := c.answers.toPrefetch(table)
			if len(jobs) == 0 {
				return
			}
			for _, job := range jobs {
				if !c.askJudged(context.Background(), job.pod, job.key, table, job.positions) {
					return // the core cannot judge them now: the next renewal tries again
				}
			}
		}
	}()
}

// maxPrefetchRounds bounds one prefetch's rounds of asking (each up to maxJudgedGroups per spec).
const maxPrefetchRounds = 8

// auditAnswer asks the core for the pod as well, and compares its answer with the cache's node by
// node (verdict, reason, score), counting the result in gpusched_plugin_answer_audits_total. The
// cache's answer stands either way. A difference is not by itself a bug (state that changed
// within answerMaxAge, another scheduler's pods); where nothing else changes, as in the
// equivalence test, every answer must match. A node with a reservation the plugin took that the
// core had not confirmed when asked is left out (counted as unconfirmed): the core answers for it
// without that reservation, the cache with it.
func (c *core) auditAnswer(ctx context.Context, pod *v1.Pod, cached *pb.PreFilterReply, cachedTable *nodeTable) {
	unconfirmed := c.answers.assumedNodes() // before asking: no node is assumed during this cycle
	asked, table, err := c.askPreFilter(ctx, pod)
	if err != nil || table == nil {
		answerAuditsTotal.WithLabelValues("unanswered").Inc()
		return
	}
	var differing []string // "node: cache {...}, core {...}", the first maxAuditNodesLogged
	count := 0
	for i, name := range table.names {
		j, ok := cachedTable.index[name]
		if _, assumed := unconfirmed[name]; !ok || assumed {
			continue // a node the cache's table did not have yet (not answered for), or unconfirmed
		}
		want := groupAnswer{verdict: asked.GetVerdicts()[i], reason: reasonOf(asked, i), score: asked.GetScores()[i]}
		got := groupAnswer{verdict: cached.GetVerdicts()[j], reason: reasonOf(cached, j), score: cached.GetScores()[j]}
		if got != want {
			if count++; len(differing) < maxAuditNodesLogged {
				differing = append(differing, fmt.Sprintf("%s: cache %+v, core %+v", name, got, want))
			}
		}
	}
	result := "match"
	if count > 0 {
		result = "mismatch"
	}
	answerAuditsTotal.WithLabelValues(result).Inc()
	// Every audit is logged (an opt-in mode): a test reads its own pods' results here.
	klog.FromContext(ctx).V(2).Info("gpusched answer audit", "pod", klog.KObj(pod), "result", result,
		"differingNodes", count, "differing", differing, "unconfirmedNodes", len(unconfirmed))
}

// maxAuditNodesLogged bounds the differing nodes one audit line names.
const maxAuditNodesLogged = 10

func reasonOf(reply *pb.PreFilterReply, i int) string {
	if ri := reply.GetReasonIndex()[i]; int(ri) < len(reply.GetReasons()) {
		return reply.GetReasons()[ri]
	}
	return ""
}

// askPreFilter asks the core (see preFilter).
func (c *core) askPreFilter(ctx context.Context, pod *v1.Pod) (*pb.PreFilterReply, *nodeTable, error) {
	wire, err := wirePod(pod)
	if err != nil {
		return nil, nil, err
	}
	var generation uint64
	if t := c.heldTable(); t != nil {
		generation = t.generation
	}
	// Twice at most: if the table changed between our read and the core's answer (another
	// cycle adopted a newer one), ask again naming none, and the answer carries its table.
	for attempt := 0; ; attempt++ {
		reply, err := call(ctx, c, func(ctx context.Context) (*pb.PreFilterReply, error) {
			return c.client.PreFilter(ctx, &pb.PreFilterRequest{ApiVersion: APIVersion, Pod: wire, TableGeneration: generation})
		})
		if err != nil {
			return nil, nil, err
		}
		if reply.GetSkip() || reply.GetError() != "" || reply.GetUnresolvable() != "" {
			return reply, nil, nil
		}
		table := c.adopt(reply)
		if table == nil {
			if attempt == 0 {
				generation = 0
				continue
			}
			return nil, nil, fmt.Errorf("gpusched core at %s answered for node table generation %d without sending it", c.address, reply.GetTableGeneration())
		}
		if n := len(table.names); len(reply.GetVerdicts()) != n || len(reply.GetScores()) != n || len(reply.GetReasonIndex()) != n {
			return nil, nil, fmt.Errorf("gpusched core at %s answered %d verdicts, %d scores, %d reason indices for a table of %d nodes",
				c.address, len(reply.GetVerdicts()), len(reply.GetScores()), len(reply.GetReasonIndex()), n)
		}
		return reply, table, nil
	}
}

// filterWhatIf asks the core to judge the pod on node with removed gone and added placed there.
func (c *core) filterWhatIf(ctx context.Context, pod *v1.Pod, node string, removed, added []*pb.Pod, nodePods []string) (*pb.FilterWhatIfReply, error) {
	wire, err := wirePod(pod)
	if err != nil {
		return nil, err
	}
	return call(ctx, c, func(ctx context.Context) (*pb.FilterWhatIfReply, error) {
		return c.client.FilterWhatIf(ctx, &pb.FilterWhatIfRequest{ApiVersion: APIVersion, Pod: wire, Node: node,
			Removed: removed, Added: added, NodePods: &pb.NodePods{Uids: nodePods}})
	})
}

// reserve asks the core to reserve the pod's GPUs on node; answeredByPlugin says PreFilter was
// answered from the cache (the core then judges the pod itself first). The groups the reply names
// are taken, so the next cycle judges node by its new group.
func (c *core) reserve(ctx context.Context, pod *v1.Pod, node string, answeredByPlugin bool) (*pb.ReserveReply, error) {
	wire, err := wirePod(pod)
	if err != nil {
		return nil, err
	}
	reply, err := call(ctx, c, func(ctx context.Context) (*pb.ReserveReply, error) {
		return c.client.Reserve(ctx, &pb.ReserveRequest{ApiVersion: APIVersion, Pod: wire, Node: node,
			AnsweredByPlugin: answeredByPlugin})
	})
	if err == nil {
		c.answers.renew(reply.GetGroups())
		if reply.GetReserved() {
			c.answers.reservedByCore(node)
		}
		c.prefetch()
	}
	return reply, err
}

func (c *core) permitted(ctx context.Context, pod *v1.Pod, node string) (*pb.PermittedReply, error) {
	wire, err := wirePod(pod)
	if err != nil {
		return nil, err
	}
	return call(ctx, c, func(ctx context.Context) (*pb.PermittedReply, error) {
		return c.client.Permitted(ctx, &pb.PermittedRequest{ApiVersion: APIVersion, Pod: wire, Node: node})
	})
}

func (c *core) unreserve(ctx context.Context, pod *v1.Pod, node, reason string, keepHold bool) error {
	wire, err := wirePod(pod)
	if err != nil {
		return err
	}
	_, err = call(ctx, c, func(ctx context.Context) (*pb.UnreserveReply, error) {
		return c.client.Unreserve(ctx, &pb.UnreserveRequest{ApiVersion: APIVersion, Pod: wire, Node: node, Reason: reason,
			KeepHold: keepHold})
	})
	return err
}

// call runs one RPC under the plugin's deadline and words its failure for the pod's status.
func call[R any](ctx context.Context, c *core, rpc func(context.Context) (R, error)) (R, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	reply, err := rpc(ctx)
	if err == nil {
		return reply, nil
	}
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.FailedPrecondition: // version skew: the core says which versions
		err = fmt.Errorf("gpusched core at %s refused this plugin: %s", c.address, st.Message())
	case codes.Unimplemented: // a call this plugin's release added, asked of an older core
		err = fmt.Errorf("gpusched core at %s is of an older release than this plugin (%s): run the plugin and the core of one gpusched release", c.address, st.Message())
	case codes.InvalidArgument: // a plugin bug: the core names what it could not read
		err = fmt.Errorf("gpusched core at %s could not read the request: %s", c.address, st.Message())
	default: // Unavailable, DeadlineExceeded, ...: nothing answered
		err = fmt.Errorf("gpusched core unreachable at %s: %s: %s; the pod waits and is retried", c.address, st.Code(), st.Message())
	}
	return reply, err
}

// wirePod is the pod as the core reads it: its JSON without metadata.managedFields, which the core
// never reads and which are often the larger half of a pod's JSON (encoded here, parsed there, per
// call).
func wirePod(pod *v1.Pod) (*pb.Pod, error) {
	trimmed := *pod // a shallow copy: the informer's object is shared and never written
	trimmed.ManagedFields = nil
	raw, err := json.Marshal(&trimmed)
	if err != nil {
		return nil, fmt.Errorf("encoding pod %s/%s as JSON: %w", pod.Namespace, pod.Name, err)
	}
	return &pb.Pod{Namespace: pod.Namespace, Name: pod.Name, Uid: string(pod.UID), Json: raw}, nil
}
