"""50 seeded random mixes of gangs and single pods through the real kube-scheduler: no gang is ever
partially bound, and every gang that fits the cluster alone is eventually bound (capacity is
freed round by round by deleting whatever is bound). The runner is devcluster.mix_runner, which
bench.gang_barrier also runs under CPU load."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from devcluster.mix_runner import run_mix
from devcluster.mixes import draw_mix, fits_alone
from devcluster.stack import Stack

MIXES = 50
PARALLEL = 10


def test_50_random_mixes_never_bind_part_of_a_gang_and_bind_every_gang_that_fits(stack: Stack):
    mixes = [draw_mix(seed) for seed in range(1000, 1000 + MIXES)]
    # The generator must produce both kinds of gang, or the test proves less than it claims.
    kinds = Counter(fits_alone(g, m.capacities) for m in mixes for g in m.gangs)
    assert kinds[True] >= 20 and kinds[False] >= 5, kinds
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda m: run_mix(stack, m), mixes))
    violations = [v for r in results for v in r.violations]
    assert not violations, "\n".join(violations[:20])
