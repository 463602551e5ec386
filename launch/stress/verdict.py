"""A sweep's verdict: what its settings say about asynchrony, in words, and how far to trust it.

Read from the rows aggregated over seeds (launch/stress/results.py `aggregate`: each
AGGREGATED key's mean, `_min` and `_max`, and `seeds`):
- each asynchronous setting against the synchronous one of the same producers and IS mode:
  its speedup (steps/hour over the synchronous setting's, the mean over seeds, with the range
  when there are several), called "faster on every seed" when the range's low end is above 1,
  "slower on every seed" when its high end is below 1, and "no clear difference" when the seeds
  disagree; one seed gives no range, so its word is "faster (one seed)" or "slower (one seed)";
  beside it, both settings' reward at equal steps;
- the load: the mean over the settings of the machine's 1-minute load average during each
  (`load_mean`, sampled by launch/stress/watch.py; the sweep's own processes count too)
  against the usable cores. The machine was loaded when the load exceeds `LOADED` times the
  cores: more threads wanted a CPU than there were, so every time measured includes waiting for
  one, and by a different amount in each setting;
- the caveat: one seed gives no spread; one seed on a loaded machine is labelled a single noisy
  measurement, not a result (docs/results.md gives measured speedups, and how they were taken).
"""

from __future__ import annotations

from typing import Any

LOADED = 1.5  # load average per usable core above which a machine counts as loaded


def _speed_word(agg: dict[str, Any]) -> str:
    """faster / slower / no clear difference, as sure as the seeds make it."""
    low, high = agg["speedup_vs_sync_min"], agg["speedup_vs_sync_max"]
    if agg["seeds"] == 1:
        return "faster (one seed)" if low > 1 else "slower (one seed)"
    if low > 1:
        return "faster on every seed"
    if high < 1:
        return "slower on every seed"
    return "no clear difference (the seeds disagree)"


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def comparison(agg: dict[str, Any], sync: dict[str, Any] | None) -> str:
    """One line: an asynchronous setting against its synchronous one."""
    loss = "" if agg.get("variant", "config") == "config" else f", loss {agg['variant']}"
    where = (
        f"max_staleness {agg['max_staleness']} ({agg['producers']} producers, "
        f"IS {agg['is_mode']}{loss})"
    )
    if sync is None or agg.get("speedup_vs_sync") is None:
        return f"- {where}: no finished synchronous setting to compare with."
    speed = f"{agg['speedup_vs_sync']:.2f}×"
    if agg["seeds"] > 1:
        low, high = agg["speedup_vs_sync_min"], agg["speedup_vs_sync_max"]
        speed += f" ({low:.2f}–{high:.2f} over {agg['seeds']} seeds)"
    return (
        f"- {where}: {speed} the synchronous steps/hour, {_speed_word(agg)}; reward at equal "
        f"steps {_fmt(agg.get('final_reward'))} against {_fmt(sync.get('final_reward'))}."
    )


def load_line(rows: list[dict[str, Any]]) -> tuple[str, bool]:
    """The load line and whether the machine was loaded ("" and False when no row measured it,
    as in sweeps older than the measurement)."""
    loads = [r["load_mean"] for r in rows if r.get("load_mean") is not None]
    cores = max((int(r["cores"]) for r in rows if r.get("cores")), default=0)
    if not loads or not cores:
        return "", False
    load = sum(loads) / len(loads)
    loaded = load > LOADED * cores
    said = (
        "a loaded machine: every time measured includes waiting for a CPU"
        if loaded
        else "not loaded"
    )
    return (
        f"- Load: 1-minute load average {load:.1f} on {cores} usable cores (the mean over the "
        f"settings, this sweep's own processes included): {said}.",
        loaded,
    )


def verdict(aggs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[str]:
    """The verdict's lines (module docstring); [] when no setting finished."""
    if not aggs:
        return []
    lines = []
    for agg in aggs:
        if agg["max_staleness"] == 0:
            continue
        same = ("producers", "is_mode", "variant")
        sync = next(
            (a for a in aggs if a["max_staleness"] == 0 and all(a[k] == agg[k] for k in same)),
            None,
        )
        lines.append(comparison(agg, sync))
    if not lines:
        lines.append("- Only synchronous settings (max_staleness = 0): nothing to compare.")
    load, loaded = load_line(rows)
    if load:
        lines.append(load)
    seeds = min(a["seeds"] for a in aggs)
    lines.append(
        f"- Seeds per setting: {seeds}"
        + ("" if seeds == 1 else f" (ranges are the lowest and highest of the {seeds})")
        + "."
    )
    if seeds == 1 and loaded:
        lines.append(
            "- **One seed on a loaded machine: a single noisy measurement, not a result.** "
            "Repeat with `--seeds 0,1,2` on an otherwise idle machine before drawing a "
            "conclusion (docs/results.md has measured speedups and how they were taken)."
        )
    elif seeds == 1:
        lines.append("- One seed gives no spread: `--seeds 0,1,2` shows how much runs vary.")
    return ["## Verdict", "", *lines, ""]


def caveat(aggs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """A plot's second title line: the seeds behind each point (error bars: their range) and,
    on a loaded machine, the load."""
    seeds = min((a["seeds"] for a in aggs), default=0)
    text = (
        "one seed per setting: no error bars"
        if seeds == 1
        else f"{seeds} seeds per setting: mean, error bars lowest–highest"
    )
    _, loaded = load_line(rows)
    if loaded:
        text += " · a loaded machine" + (": a single noisy measurement" if seeds == 1 else "")
    return text
