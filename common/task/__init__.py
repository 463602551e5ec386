"""The built-in task and the scoring math evaluation shares.

- synthetic.py: the synthetic verifiable task (zero-padded addition), train/held-out split, the
  correctness rule;
- pass_at_k.py: the unbiased pass@k estimator (Chen et al. 2021).
"""
