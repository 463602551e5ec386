"""The sampling distribution, one rule for the learner and the engines alike.

- logprobs.py: a token's log-prob is `log_softmax(logits / temperature)[token]`; entropy; our
  sampler's truncation batched;
- kept_set.py: truncated sampling's kept set: the rule, the renormalised log-prob, its encoding.
"""
