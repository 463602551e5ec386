"""What this host offers a model: where it lives and where it runs.

- core_board.py: the host's cores shared by a run's processes (who has work now, each one's
  torch threads);
- device.py: 'auto' / 'cpu' / 'cuda:N' to a torch device (learner and hf engine);
- model_dir.py: model.path to a local model directory (a directory, or a name in the local
  Hugging Face cache, offline).
"""
