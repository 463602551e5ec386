"""A run's loss and advantage options, built once from its config (the config's "0 = off"
become None here); the loss (loss.py) and the advantages (advantages.py) stay pure functions of
tensors and these options."""

from __future__ import annotations

from common.config import Config
from consumer.train import advantages as ADV
from consumer.train import loss as L


def loss_options(cfg: Config) -> L.LossOptions:
    """The loss options of a run, built once: the config's "0 = off" become None here."""
    c = cfg.loss
    tis = L.TISConfig(c.tis_level, c.tis_mode, c.tis_cap, c.tis_cap_min or None) if c.tis else None
    return L.LossOptions(
        clip_low=c.clip_low,
        clip_high=c.clip_high,
        dual_clip=c.dual_clip or None,
        tis=tis,
        agg=c.agg,
        norm_const=c.norm_const or float(cfg.sampling.max_new_tokens),
        beta=c.beta,
        kl=c.kl,
        objective=c.objective,
        ratio_level=c.ratio_level,
    )


def advantage_options(cfg: Config) -> ADV.AdvantageOptions:
    """The advantage options of a run, built once."""
    c = cfg.loss
    return ADV.AdvantageOptions(
        baseline=c.adv_baseline,
        scale=c.adv_scale,
        eps=c.adv_eps,
        overlong_window=c.overlong_window,
        overlong_penalty=c.overlong_penalty,
        max_len=cfg.sampling.max_new_tokens,
    )
