package gpusched

import (
	"fmt"
	"testing"
	"time"

	pb "github.com/gpusched/gpusched/scheduler-plugin/gen/scheduling/v1"
)

// BenchmarkAnswerFromCache is a PreFilter answered from the cache at 5,000 nodes in 300 groups,
// a third of them not fitting with a reason of their own (issue 43's 5,000-node figure).
func BenchmarkAnswerFromCache(b *testing.B) {
	const nodes, groups = 5000, 300
	names := make([]string, nodes)
	ids := make([]uint32, nodes)
	for i := range names {
		names[i], ids[i] = fmt.Sprintf("node-%05d", i), uint32(1+i%groups)
	}
	reply := &pb.PreFilterReply{TableGeneration: 7, Reasons: []string{""}, Cacheable: true, Groups: groupsOf(11, 7, ids...),
		Verdicts: make([]byte, nodes), Scores: make([]byte, nodes), ReasonIndex: make([]uint32, nodes)}
	for i, gid := range ids {
		if gid%3 == 0 {
			reply.Verdicts[i] = byte(pb.Verdict_VERDICT_NOT_NOW)
			reply.ReasonIndex[i] = uint32(len(reply.Reasons))
			reply.Reasons = append(reply.Reasons, fmt.Sprintf("only %d of 8 GPUs free without a foreign process; pod needs 4", gid%4))
		} else {
			reply.Scores[i] = byte(gid % 100)
		}
	}
	c := newAnswerCache(time.Hour, time.Now)
	c.learn("spec", reply)
	table := &nodeTable{generation: 7, names: names}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := c.answer("spec", table); !ok {
			b.Fatal("not answered")
		}
	}
}
