"""What a user starts: the `asyncgrpo` command and what it runs on this machine.

- cli/: the typer app, one module per command family;
- local.py: a consumer and its producers as supervised processes (`launch`, each sweep setting);
- cores.py: threads and producers by the cores this process may use; placement.py: which GPU
  each process of a sweep setting gets;
- stress/: the staleness sweep;
- dashboard.py: the live view and `asyncgrpo status`; report.py: summary.md and plots;
  headline.py: the headline numbers every view shows; compare.py: several runs overlaid;
- run_dir.py: claiming a run directory (resume, force);
- demo_model.py: the embedded demo model; gguf_model.py: `make-model --from-gguf`;
- export.py: `asyncgrpo export`, a run's policy as a model directory (a LoRA adapter merged).
"""
