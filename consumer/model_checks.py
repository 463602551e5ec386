"""The run's model, checked when the learner starts: it loads, and it has a chat template when
the prompts need one. Either failure is a `ConfigError` in one line (the consumer exits 2, and
nothing restarts it: no restart can make a model load), never a traceback.
"""

from __future__ import annotations

from pathlib import Path

from common.config import Config
from common.errors import ConfigError, first_line
from consumer.data.prompts import PromptSource
from consumer.train.protocol import Trainer


def load_trainer(cfg: Config, model_dir: Path) -> Trainer:
    """The trainer of `model_dir`; a model that does not load (no weights, a broken config, an
    unknown architecture) is a `ConfigError` in one line: no restart can help."""
    from consumer.train import make_trainer

    try:
        return make_trainer(cfg, model_dir)
    except ConfigError:
        raise
    except (OSError, ValueError, RuntimeError, ImportError, KeyError) as exc:
        raise ConfigError(
            f"cannot load the model {str(model_dir)!r} (model.path): "
            f"{type(exc).__name__}: {first_line(exc)}"
        ) from exc


def check_chat_template(prompts: PromptSource, cfg: Config, model_dir: Path | None) -> None:
    """Prompts in chat form (`task.prompt_format = "chat"`, or rows whose prompt is a message
    list) need the model's chat template: refuse at start a model without one."""
    if model_dir is None or not (prompts.has_chat or cfg.task.prompt_format == "chat"):
        return
    from transformers import AutoTokenizer

    if not getattr(AutoTokenizer.from_pretrained(model_dir), "chat_template", None):
        why = "its prompts are chat messages" if prompts.has_chat else "task.prompt_format = 'chat'"
        raise ConfigError(
            f"task: {why}, which the producers render with the model's chat template, and "
            f"model.path = {str(model_dir)!r} has none (tokenizer_config.json or "
            "chat_template.jinja); use a chat model, or text prompts with prompt_format = 'raw'"
        )
