"""Writing runs: TraceWriter, its thread and process backends, and the sink that commits batches."""
