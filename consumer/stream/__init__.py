"""A run's recorded stream (RUN/stream/) and its replay.

What it owns: the segment format (segments.py: hashed records, torn-tail repair), the typed
step and snapshot entries (records.py), the recorder thread the learner feeds (recorder.py),
reading a stream back into the steps to replay (reader.py) and the rules of which settings a
replay may change (rules.py). The replaying learner itself is consumer/replay.py.
What it does not do: sockets, the lease book, training (the learner and the trainer do).
"""
