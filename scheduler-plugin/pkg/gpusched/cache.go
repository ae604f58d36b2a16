package gpusched

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// DefaultAnswerMaxAge is how long the groups the core last named may answer PreFilter without
// asking it (issue 43). Every Reserve and every asked PreFilter renews them, so during a burst the
// plugin answers pod after pod itself; what changes without a cycle of this scheduler (telemetry,
// pods deleted) reaches it within this age.
const DefaultAnswerMaxAge = time.Second

// maxCachedSpecs bounds the pod specs whose answers are kept (oldest dropped first): a spec's
// answers are a few bytes per group, and a burst is of a handful of specs.
const maxCachedSpecs = 256

// answerCache keeps the core's cacheable PreFilter answers per pod spec and node group, so that a
// pod whose spec the core has judged is answered in kube-scheduler's process, with no round trip.
//
// The core marks an answer cacheable when it depends on nothing but the pod's spec and each node's
// group (same GPU shape, same free units), and names the group of every table node with it and
// with each reservation. Only state is kept here, never logic: a node whose group has no answer
// for the spec, groups older than maxAge or of another table, or an answer in which no node fits
// (the pod would wait on the plugin's word alone) send the pod to the core as before; so does a
// pod whose cycle on a cached answer found no node (PostFilter), before anything is preempted for
// it. Reserve stays the core's, on its own state: an answer that went stale is refused there and
// nothing is promised twice.
//
// A node the plugin reserved on itself (assume: Reserve of a pod answered here, on a node whose
// move the answer named) is judged by the group the core named as its move until the core
// confirms the reservation (settle); a node whose group is unknown meanwhile (a refused or
// unconfirmed reservation, a new grouping) is answered "not now" rather than read in its old group.
type answerCache struct {
	maxAge time.Duration // 0: never answer from the cache
	now    func() time.Time

	mu        sync.Mutex
	grouping  uint64   // the core's grouping the ids and answers belong to (0: none yet)
	tableGen  uint64   // the node table ids is indexed by
	ids       []uint32 // group id per table node, as the core last named them
	ledgerVer uint64   // the core's ledger version ids were grouped under (newer ids only replace them)
	renewedAt time.Time
	specs     map[string]map[uint32]groupAnswer // spec key -> group id -> answer
	order     []string                          // spec keys, oldest first
	skips     map[string]struct{}               // spec keys the core skipped (no GPUs asked), bounded like specs
	skipOrder []string
	askNext   map[types.UID]struct{}  // pods whose next PreFilter asks the core (askFor)
	assumed   map[string]*assumedNode // by node name: reserved on by the plugin, not yet confirmed
	recent    []recentSpec            // specs PreFilter was asked for lately, oldest first (noteSpec)
}

// groupAnswer is the core's answer for one node group: what every node of the group gets, and the
// group a node of it moves to once a pod of the spec is reserved there (0: not named).
type groupAnswer struct {
	verdict byte
	reason  string
	score   byte
	move    uint32
	judged  bool // from JudgeGroups, which names the move of every group it can
}

// assumedNode is a node with reservations the plugin took that the core has not confirmed yet: the
// group it is judged by meanwhile (0: unknown, answered "not now") and how many are unconfirmed.
type assumedNode struct {
	gid     uint32
	pending int
}

// confirmingReason is an assumed node's answer when its group is unknown until the core confirms.
const confirmingReason = "gpusched is confirming a reservation on this node; it is judged again once the core has"

func newAnswerCache(maxAge time.Duration, now func() time.Time) *answerCache {
	return &answerCache{maxAge: maxAge, now: now, specs: map[string]map[uint32]groupAnswer{},
		skips: map[string]struct{}{}, askNext: map[types.UID]struct{}{}, assumed: map[string]*assumedNode{}}
}

// maxAskNext bounds askNext: past it the set is emptied (those pods are answered from the cache
// once more, and land here again if no node fits).
const maxAskNext = 4096

// askFor makes pod's next PreFilter ask the core: a cycle answered from the cache found no node for
// it (see Plugin.PostFilter), and that is never decided on the plugin's word.
func (c *answerCache) askFor(pod types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.askNext) >= maxAskNext {
		clear(c.askNext)
	}
	c.askNext[pod] = struct{}{}
}

// mustAsk says whether pod's PreFilter must ask the core (askFor), and takes it off the list.
func (c *answerCache) mustAsk(pod types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.askNext[pod]
	delete(c.askNext, pod)
	return ok
}

// specKey names what the core judges a pod by: its namespace, labels, annotations and spec (the
// whole spec, not the fields the core reads today: a field it starts reading can never make two
// different pods one key). Pods of one Deployment share it; their names and UIDs are left out.
func specKey(pod *v1.Pod) (string, error) {
	spec, err := pod.Spec.Marshal() // protobuf, deterministic: map entries sorted
	if err != nil {
		return "", fmt.Errorf("encoding the spec of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	h := sha256.New()
	field := func(b []byte) {
		_ = binary.Write(h, binary.LittleEndian, uint64(len(b)))
		h.Write(b)
	}
	field([]byte(pod.Namespace))
	for _, m := range []map[string]string{pod.Labels, pod.Annotations} {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		_ = binary.Write(h, binary.LittleEndian, uint64(len(keys)))
		for _, k := range keys {
			field([]byte(k))
			field([]byte(m[k]))
		}
	}
	field(spec)
	return string(h.Sum(nil)), nil
}

// renew takes the groups the core named (a PreFilter or Reserve reply); answers learned under
// another grouping are dropped. Nil (the core named none) changes nothing.
func (c *answerCache) renew(groups *pb.Groups) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.renewLocked(groups)
}

// uint32s reads little-endian uint32s (a Groups' ids, a reply's moves); nil when b is not of them.
func uint32s(b []byte) []uint32 {
	if len(b)%4 != 0 {
		return nil
	}
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}

// renewLocked is renew with c.mu held. Replies travel on several connections at once: ids of the
// table held that were grouped under an older ledger version than the held ones arrive late, and
// are not taken (nor do they renew the age).
func (c *answerCache) renewLocked(groups *pb.Groups) {
	if groups == nil || groups.GetGrouping() == 0 || len(groups.GetIds())%4 != 0 {
		return
	}
	if groups.GetGrouping() != c.grouping {
		c.grouping = groups.GetGrouping()
		clear(c.specs)
		c.order = c.order[:0]
		for _, a := range c.assumed {
			a.gid = 0 // an id of the old grouping: unknown until confirmed
		}
	} else if groups.GetTableGeneration() == c.tableGen && groups.GetLedgerVersion() < c.ledgerVer {
		return
	}
	c.tableGen, c.ids, c.ledgerVer, c.renewedAt = groups.GetTableGeneration(), uint32s(groups.GetIds()), groups.GetLedgerVersion(), c.now()
}

// forget makes the next PreFilter ask the core: an answer from the cache was refused at Reserve, or
// capacity may have come back (a GPU pod deleted, the core's requeue stream).
func (c *answerCache) forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.renewedAt = time.Time{}
}

// learn keeps a cacheable answer's per-group answers for key, once its groups are taken (renew).
// A group answered two ways (never, from a core that marks the answer cacheable) is not kept.
func (c *answerCache) learn(key string, reply *pb.PreFilterReply) {
	if c.maxAge <= 0 || !reply.GetCacheable() {
		return
	}
	if reply.GetSkip() { // the spec asks for no GPUs: so does every pod of it, whatever the nodes
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, known := c.skips[key]; !known {
			if len(c.skipOrder) >= maxCachedSpecs {
				delete(c.skips, c.skipOrder[0])
				c.skipOrder = c.skipOrder[1:]
			}
			c.skips[key] = struct{}{}
			c.skipOrder = append(c.skipOrder, key)
		}
		return
	}
	if reply.GetGroups() == nil {
		return
	}
	ids, moves := uint32s(reply.GetGroups().GetIds()), uint32s(reply.GetMoves())
	c.mu.Lock()
	defer c.mu.Unlock()
	c.renewLocked(reply.GetGroups())
	// Learned by the reply's own ids (renew may have kept newer ones), under the grouping held.
	if reply.GetGroups().GetGrouping() != c.grouping || reply.GetGroups().GetTableGeneration() != reply.GetTableGeneration() ||
		len(ids) != len(reply.GetVerdicts()) || len(reply.GetScores()) != len(ids) || len(reply.GetReasonIndex()) != len(ids) ||
		(len(moves) != len(ids) && len(moves) != 0) {
		return
	}
	known, ok := c.specs[key]
	if !ok {
		if len(c.order) >= maxCachedSpecs {
			delete(c.specs, c.order[0])
			c.order = c.order[1:]
		}
		known = map[uint32]groupAnswer{}
		c.specs[key] = known
		c.order = append(c.order, key)
	}
	mergeAnswers(known, ids, reply.GetVerdicts(), reply.GetScores(), reply.GetReasonIndex(), reply.GetReasons(), moves, false)
}

// mergeAnswers keeps in known, per group id of ids, the answer at its index in the other vectors
// (moves may be empty: none named), marked judged when from JudgeGroups; the newest answer for a
// group wins. A group answered two ways in one reply (never, from a core that marks the answer
// cacheable) is dropped. The vectors are of ids' length (the caller checks).
func mergeAnswers(known map[uint32]groupAnswer, ids []uint32, verdicts, scores []byte, reasonIndex []uint32,
	reasons []string, moves []uint32, judged bool) {
	thisReply := map[uint32]groupAnswer{}
	conflicting := map[uint32]bool{}
	for i, gid := range ids {
		reason := ""
		if ri := reasonIndex[i]; int(ri) < len(reasons) {
			reason = reasons[ri]
		}
		a := groupAnswer{verdict: verdicts[i], reason: reason, score: scores[i], judged: judged}
		if len(moves) == len(ids) {
			a.move = moves[i]
		}
		if prev, seen := thisReply[gid]; seen && prev != a {
			conflicting[gid] = true
		}
		thisReply[gid] = a
	}
	for gid, a := range thisReply {
		if conflicting[gid] {
			delete(known, gid)
		} else {
			known[gid] = a // the newest answer for the group wins
		}
	}
}

// maxJudgedGroups bounds the groups one JudgeGroups asks for: past it (a regrouping of much of the
// fleet) the whole cycle is asked for instead.
const maxJudgedGroups = 64

// unjudged is, for a spec whose answers the cache holds and could answer from but for some groups
// of the held ids (telemetry moved nodes into groups never judged for it), one table position per
// such group, to ask the core for (JudgeGroups); nil when there are none, more than
// maxJudgedGroups, or the cache cannot answer for another reason.
func (c *answerCache) unjudged(key string, table *nodeTable) []uint32 {
	if c.maxAge <= 0 || table == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unjudgedLocked(key, table, false)
}

// unjudgedLocked is unjudged with c.mu held; with moveless, also the groups whose answer fits but
// names no move, unless JudgeGroups gave it (a whole cycle's answer names at most 64 moves, the
// best-scored groups': a pod the plugin answers on another is reserved by the core in the cycle).
func (c *answerCache) unjudgedLocked(key string, table *nodeTable, moveless bool) []uint32 {
	known := c.specs[key]
	if known == nil || c.grouping == 0 || c.tableGen != table.generation || len(c.ids) != len(table.names) ||
		c.now().Sub(c.renewedAt) > c.maxAge {
		return nil
	}
	var positions []uint32
	asked := map[uint32]bool{}
	for i, gid := range c.ids {
		a, ok := known[gid]
		if ok && !(moveless && a.move == 0 && !a.judged && pb.Verdict(a.verdict) == pb.Verdict_VERDICT_FITS) || asked[gid] {
			continue
		}
		if _, assumed := c.assumed[table.names[i]]; assumed {
			continue // judged by its assumed group (answer)
		}
		if len(positions) == maxJudgedGroups {
			if moveless {
				break // the rest on a later renewal
			}
			return nil
		}
		asked[gid] = true
		positions = append(positions, uint32(i))
	}
	return positions
}

// maxPrefetchSpecs bounds the specs whose lacking groups are asked for ahead of their next pod.
const maxPrefetchSpecs = 4

// recentSpec is a spec a PreFilter was asked for lately: a pod of it to ask the core with.
type recentSpec struct {
	key string
	pod *v1.Pod
	at  time.Time
}

// noteSpec records that a pod of key is being scheduled: the spec's lacking groups are asked for
// ahead of its next pod (prefetch) while it was seen within maxAge.
func (c *answerCache) noteSpec(key string, pod *v1.Pod) {
	if c.maxAge <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recent = slices.DeleteFunc(c.recent, func(r recentSpec) bool { return r.key == key })
	if len(c.recent) == maxPrefetchSpecs {
		c.recent = c.recent[1:]
	}
	c.recent = append(c.recent, recentSpec{key: key, pod: pod, at: c.now()})
}

// prefetchJob is one spec's groups to ask the core for ahead of its next pod.
type prefetchJob struct {
	key       string
	pod       *v1.Pod
	positions []uint32
}

// toPrefetch is, for each spec seen within maxAge (newest first), the groups of table it lacks
// (unjudged) or holds no move for, where there are some to ask for (at most maxJudgedGroups).
func (c *answerCache) toPrefetch(table *nodeTable) []prefetchJob {
	if c.maxAge <= 0 || table == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var jobs []prefetchJob
	for i := len(c.recent) - 1; i >= 0; i-- {
		r := c.recent[i]
		if c.now().Sub(r.at) > c.maxAge {
			continue
		}
		if positions := c.unjudgedLocked(r.key, table, true); len(positions) > 0 {
			jobs = append(jobs, prefetchJob{key: r.key, pod: r.pod, positions: positions})
		}
	}
	return jobs
}

// learnJudged keeps the core's answers for the groups of n nodes (a JudgeGroups reply, or a
// confirmed reservation's next) as answers for key, under the grouping held; false when the reply
// cannot be read so (not judged, another grouping, vectors not n long).
func (c *answerCache) learnJudged(key string, n int, reply *pb.JudgeGroupsReply) bool {
	ids, moves := uint32s(reply.GetIds()), uint32s(reply.GetMoves())
	if reply.GetNotJudged() != "" || len(ids) != n || len(moves) != n || len(reply.GetVerdicts()) != n ||
		len(reply.GetScores()) != n || len(reply.GetReasonIndex()) != n {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	known := c.specs[key]
	if known == nil || reply.GetGrouping() != c.grouping {
		return false
	}
	mergeAnswers(known, ids, reply.GetVerdicts(), reply.GetScores(), reply.GetReasonIndex(), reply.GetReasons(), moves, true)
	return true
}

// answer is the PreFilter reply the core would give a pod of key on table, built from the answers
// learned for key; false when it cannot be (see answerCache), and the core must be asked.
func (c *answerCache) answer(key string, table *nodeTable) (*pb.PreFilterReply, bool) {
	if c.maxAge <= 0 {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, skip := c.skips[key]; skip {
		return &pb.PreFilterReply{Skip: true, Cacheable: true}, true
	}
	if table == nil {
		return nil, false
	}
	known := c.specs[key]
	if known == nil || c.grouping == 0 || c.tableGen != table.generation || len(c.ids) != len(table.names) ||
		c.now().Sub(c.renewedAt) > c.maxAge {
		return nil, false
	}
	reply := &pb.PreFilterReply{TableGeneration: c.tableGen, Reasons: []string{""}, Cacheable: true,
		Verdicts: make([]byte, len(c.ids)), Scores: make([]byte, len(c.ids)), ReasonIndex: make([]uint32, len(c.ids)),
		Summary: "answered by the GpuSched plugin from the core's answers for this pod's spec"}
	reasonAt := map[string]uint32{"": 0}
	// Each group resolved once, in a slot by group id (its answer looked up and its reason indexed
	// once, not per node): 100 -> 29 us at 5,000 nodes in 300 groups (BenchmarkAnswerFromCache).
	slot := resolvedSlots(c.ids)
	for i, gid := range c.ids {
		r := slot(gid)
		if !r.seen {
			a, ok := known[gid]
			*r = resolvedAnswer{seen: true, known: ok, verdict: a.verdict, score: a.score}
			if ok {
				r.reasonIndex = reasonIndex(reply, reasonAt, a.reason)
			}
		}
		if !r.known {
			if _, assumed := c.assumed[table.names[i]]; assumed {
				continue // left "fits" (the zero verdict): judged by its assumed group below
			}
			return nil, false
		}
		reply.Verdicts[i], reply.Scores[i], reply.ReasonIndex[i] = r.verdict, r.score, r.reasonIndex
	}
	c.patchAssumedLocked(known, reply, table, reasonAt)
	if bytes.IndexByte(reply.Verdicts, byte(pb.Verdict_VERDICT_FITS)) < 0 {
		return nil, false
	}
	return reply, true
}

// resolvedAnswer is one group's answer as answer writes it into a reply (seen: resolved already;
// known: the spec has one).
type resolvedAnswer struct {
	seen        bool
	known       bool
	verdict     byte
	score       byte
	reasonIndex uint32
}

// resolvedSlots returns each group id's slot for answer: a slice by id while the ids are dense (a
// grouping's ids count up from 1, and a long-lived one with much churn may outgrow it), else a map.
func resolvedSlots(ids []uint32) func(uint32) *resolvedAnswer {
	var maxID uint32
	if len(ids) > 0 {
		maxID = slices.Max(ids)
	}
	if int(maxID) <= 4*len(ids)+1024 {
		dense := make([]resolvedAnswer, maxID+1)
		return func(gid uint32) *resolvedAnswer { return &dense[gid] }
	}
	sparse := map[uint32]*resolvedAnswer{}
	return func(gid uint32) *resolvedAnswer {
		r := sparse[gid]
		if r == nil {
			r = &resolvedAnswer{}
			sparse[gid] = r
		}
		return r
	}
}

func setAnswer(reply *pb.PreFilterReply, reasonAt map[string]uint32, i int, a groupAnswer) {
	reply.Verdicts[i], reply.Scores[i] = a.verdict, a.score
	reply.ReasonIndex[i] = reasonIndex(reply, reasonAt, a.reason)
}

// reasonIndex is reason's index in reply.Reasons, appended the first time (reasonAt indexes them).
func reasonIndex(reply *pb.PreFilterReply, reasonAt map[string]uint32, reason string) uint32 {
	ri, ok := reasonAt[reason]
	if !ok {
		ri = uint32(len(reply.Reasons))
		reasonAt[reason] = ri
		reply.Reasons = append(reply.Reasons, reason)
	}
	return ri
}

// patchAssumedLocked answers each assumed node of table that reply has fitting by its assumed
// group's answer in known, or "not now" (confirmingReason) where that is unknown. A node reply
// has not fitting keeps its answer and reason: a reservation more can only make it fuller.
// reasonAt indexes reply.Reasons.
func (c *answerCache) patchAssumedLocked(known map[uint32]groupAnswer, reply *pb.PreFilterReply, table *nodeTable,
	reasonAt map[string]uint32) {
	for name, assumed := range c.assumed {
		i, ok := table.index[name]
		if !ok || i >= len(reply.Verdicts) || pb.Verdict(reply.Verdicts[i]) != pb.Verdict_VERDICT_FITS {
			continue
		}
		a, ok := known[assumed.gid]
		if !ok || assumed.gid == 0 {
			a = groupAnswer{verdict: byte(pb.Verdict_VERDICT_NOT_NOW), reason: confirmingReason}
		}
		setAnswer(reply, reasonAt, i, a)
	}
}

// overlay answers the assumed nodes in a reply the core gave (asked, not from the cache) for a pod
// of key: the core had not confirmed those reservations when it answered.
func (c *answerCache) overlay(key string, reply *pb.PreFilterReply, table *nodeTable) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.assumed) == 0 || table == nil || len(reply.GetVerdicts()) != len(table.names) ||
		len(reply.GetScores()) != len(table.names) || len(reply.GetReasonIndex()) != len(table.names) {
		return
	}
	if len(reply.Reasons) == 0 {
		reply.Reasons = []string{""}
	}
	reasonAt := make(map[string]uint32, len(reply.Reasons))
	for i, r := range reply.Reasons {
		if _, seen := reasonAt[r]; !seen {
			reasonAt[r] = uint32(i)
		}
	}
	c.patchAssumedLocked(c.specs[key], reply, table, reasonAt)
}

// assume takes a reservation of a pod of key on node in the plugin (issue 43): the node is judged by
// the group its answer for key names as its move until the core confirms (settle). False when the
// node's current answer for key names no move, or is not "fits": the core must reserve it itself.
func (c *answerCache) assume(key string, table *nodeTable, node string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.maxAge <= 0 || table == nil || c.tableGen != table.generation || len(c.ids) != len(table.names) {
		return false
	}
	i, ok := table.index[node]
	if !ok {
		return false
	}
	gid := c.ids[i]
	assumed := c.assumed[node]
	if assumed != nil {
		gid = assumed.gid
	}
	a, ok := c.specs[key][gid]
	if !ok || gid == 0 || a.move == 0 || pb.Verdict(a.verdict) != pb.Verdict_VERDICT_FITS {
		return false
	}
	if assumed == nil {
		assumed = &assumedNode{}
		c.assumed[node] = assumed
	}
	assumed.gid = a.move
	assumed.pending++
	return true
}

// knowsMove says whether the answers for key hold the group node is judged by while its
// reservations are unconfirmed (its assumed move): if not, the plugin asks the core's confirmation
// for the node's next answer.
func (c *answerCache) knowsMove(key, node string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	assumed := c.assumed[node]
	if assumed == nil || assumed.gid == 0 {
		return false
	}
	_, ok := c.specs[key][assumed.gid]
	return ok
}

// settle takes the core's answer to reservations assumed on nodes (one entry per reservation, in
// order): the groups it named once they were taken (nil: none, e.g. the core was not reached), and
// whether each was reserved. A node with no reservation unconfirmed is judged by the core's groups
// again; a refusal (or no answer) leaves its node unknown until then, and the next PreFilter asks.
func (c *answerCache) settle(groups *pb.Groups, nodes []string, reserved []bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.renewLocked(groups)
	for i, node := range nodes {
		assumed := c.assumed[node]
		if assumed == nil {
			continue
		}
		if !reserved[i] {
			assumed.gid = 0
			c.renewedAt = time.Time{}
		}
		if assumed.pending--; assumed.pending <= 0 {
			delete(c.assumed, node)
		}
	}
}

// withdrawn notes that one of node's assumed reservations was taken back before the core heard of
// it. The node's other unconfirmed ones, if any, leave it unknown (its assumed group counted the
// withdrawn one too) until they are confirmed.
func (c *answerCache) withdrawn(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	assumed := c.assumed[node]
	if assumed == nil {
		return
	}
	if assumed.pending--; assumed.pending <= 0 {
		delete(c.assumed, node)
	} else {
		assumed.gid = 0
	}
}

// assumedNodes is the nodes with reservations the plugin took that the core has not confirmed.
func (c *answerCache) assumedNodes() map[string]struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	nodes := make(map[string]struct{}, len(c.assumed))
	for name := range c.assumed {
		nodes[name] = struct{}{}
	}
	return nodes
}

// reservedByCore notes a reservation the core took on node in a Reserve call: a node with
// reservations of the plugin's still unconfirmed cannot be judged by its assumed group any more.
func (c *answerCache) reservedByCore(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if assumed := c.assumed[node]; assumed != nil {
		assumed.gid = 0
	}
}

// capacityFreed forgets the cache's groups when kube-scheduler's informer shows a GPU pod going (deleted,
// or terminating), whose GPUs the core is about to free: the next PreFilter asks the core rather than
// read the node as full. What only the core sees comes over its requeue stream (watchRequeue).
type capacityFreed struct {
	answers *answerCache
}

func (h capacityFreed) OnAdd(any, bool) {}

func (h capacityFreed) OnUpdate(oldObj, newObj any) {
	old, okOld := oldObj.(*v1.Pod)
	pod, okNew := newObj.(*v1.Pod)
	if okOld && okNew && pod.Spec.NodeName != "" && requestsGPUs(pod) &&
		(old.DeletionTimestamp == nil && pod.DeletionTimestamp != nil || !terminal(old) && terminal(pod)) {
		h.answers.forget()
	}
}

func (h capacityFreed) OnDelete(obj any) {
	pod, ok := obj.(*v1.Pod)
	if !ok || (pod.Spec.NodeName != "" && requestsGPUs(pod)) { // a tombstone: forget rather than guess
		h.answers.forget()
	}
}

func terminal(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}
