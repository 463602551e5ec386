"""What both sides share and nothing else; it imports neither side and runs in whichever
process calls it. Grouped by kind:

- wire/: the wire schema (messages, codec, sizes, the bounded msgpack reader): the only code that
  knows the bytes;
- config/: the typed config tree: sections with their checks, TOML, --set, validation;
- net/: addresses and sockets (endpoints, ZeroMQ sockets per role, CurveZMQ keys), the heartbeat
  period, rate-limited log lines about bad messages;
- weights/: snapshot layout, manifest and hashes, the safetensors tensor table, deltas, chunk
  manifests;
- files/: the run directory's typed files (run_files.py's records, metrics.jsonl,
  completions.jsonl, netstats.json) and large JSON written an entry at a time;
- sampling/: the sampling distribution's log-prob rule and truncated sampling's kept sets
  (learner and engines alike);
- task/: the built-in synthetic task and the pass@k estimator;
- host/: this host's torch device and local model directories;
- errors.py: the exceptions that cross module boundaries, and the processes' exit codes;
- progress.py: progress lines of long work (every 10 s, at the first unit and each tenth).
"""
