"""The loading error every front end shows as one line."""


class CheckpointError(ValueError):
    """A checkpoint path that cannot be loaded (missing, not a model folder, unreadable)."""
