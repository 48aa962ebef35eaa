"""The round: one target forward per round over the draft, its cache bookkeeping, the run handle and the
plain baseline."""
