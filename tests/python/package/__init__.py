"""The package's own tests: the ABI view (stowage._lib, Plan, Runtime, agree), the torch wrapper
(PlannedLayers: CPU, GPU, the hot path, microbatches, HF-shaped decoder layers) and the runtime's
trace against the simulator's."""
