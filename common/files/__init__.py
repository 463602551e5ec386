"""The run directory's files, each with one typed reader and writer (nobody indexes their JSON
by string).

- run_files.py: the file names and typed records (ledger, lease lines, producers' files,
  endpoints, step summary);
- run_state.py: how a run stands: the consumer serving it (consumer.json), whether its groups
  carry a learning signal (signal.json), how it ended (final.json);
- metrics.py: `StepRecord`, one typed line of metrics.jsonl, and its JSONL sink;
- completions_file.py: completions.jsonl's rows, reader, writer and Markdown table;
- net_stats.py: netstats.json, the network thread timed from inside;
- json_text.py: large JSON files written an entry at a time;
- disk.py: disk faults: the file a failed write was for, the disk's errors told apart, the
  one line a stopped run prints; atomic replaces and appends that name their file.
"""
