"""A task's data, read once at start and then served from memory: who reads it is the learner
(its prompt source, handed to the network thread, which leases from it), evaluation (held-out
rows) and `asyncgrpo eval`; none of them reaches into another's room for it.

- sources.py: a task's rows from JSONL, Parquet or a Hugging Face dataset (offline), every row
  checked at start (a bad row stops the run with its file, row and field);
- rows.py: one row checked: prompt text or chat messages, answer, other columns, size bound;
- prompts.py: prompt sources (the synthetic task, your rows) and the seeded order leases follow.
"""
