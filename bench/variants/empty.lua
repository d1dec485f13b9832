-- A script call and nothing else, given the flush's keys and arguments: what any script call costs
-- Redis at a pace (bench/flush_cost.py --variant bench/variants/empty.lua; docs/benchmarks.md).
return {1, 0, 0, {}, 0, ''}
