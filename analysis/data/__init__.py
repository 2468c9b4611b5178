"""Study data: load from storage, the tidy frames, their schema, speedups, selections (pandas)."""
