"""Where draft tokens come from: proposers, the one registry of proposer specs, tree shapes and their
growth, the n-gram index."""
