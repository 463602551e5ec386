"""What this host offers a model: where it lives and where it runs.

- device.py: 'auto' / 'cpu' / 'cuda:N' to a torch device (learner and hf engine);
- model_dir.py: model.path to a local model directory (a directory, or a name in the local
  Hugging Face cache, offline).
"""
