"""The JSONL trace format: export, import, reading and validating lines, and TraceFile for other decoders."""
