"""Measurements and the recipes they check: stowage.measure (the hf measured profile, LiveBytes
and its op work) and the planner's hf and megatron recipes against the frameworks' own code
(layer kinds, norms, linear attention, data parallelism, parameter counts, megatron layers)."""
