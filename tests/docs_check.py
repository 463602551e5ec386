"""What tests/unit/test_docs.py checks in README.md and docs/, and how.

Checked in every page (README.md and docs/**/*.md), outside and inside code blocks as stated:
- every relative link `[text](target)` names a file or directory of the repository, and its
  `#anchor` a heading of the Markdown page it points to (GitHub's heading slugs);
- every command shown in a `bash` / `sh` / `shell` / `console` code block (or a block with no
  language whose first line runs one of the programs below), and every inline code
  span that starts with one of the programs below (or with a script, `bench/X.py --option`), is
  valid as written:
  `asyncgrpo ...` (also `python -m launch.cli ...` and `torchrun ... -m launch.cli ...`) parses
  against the CLI itself (the typer app's click parser, nothing run): the command and
  subcommand exist, every option exists and has its value (an inline mention may leave the
  value out), no argument is left over;
  `python X.py` / `torchrun X.py` name an existing file and use only options it defines;
  `python -m M` an importable module; `bash FILE` an existing script and only its options;
  `pip install -c FILE -e '.[extras]'` an existing constraints file and declared extras;
  `mutmut run "PATTERN"` a module that `[tool.mutmut]` mutates;
  any argument naming a path in one of the repository's folders, an existing one;
- every repository path named in the prose (`consumer/server/leases.py`, `docs/custom_task/`)
  exists, and every dotted name of ours (`consumer.train.trainer.loss_options`) imports;
- the file map of docs/architecture.md lists exactly the product files, bench and test helpers
  and doc pages that exist; the README's package map lists every package;
- every shown `asyncgrpo` command that names one of the repository's config files or sets keys
  (`--config docs/episodes/calculator.toml --set ...`) gets a valid config from them, and the
  reward functions and environment it names import with the command's `PYTHONPATH=` (for the
  commands that run them: launch, producer, stress, eval);
- docs/config.md's table is what `asyncgrpo config docs` prints, and the README stays short.

Some of the commands shown are also run for real elsewhere: `asyncgrpo launch`
(tests/e2e/test_launch.py), the custom task's consumer and producer
(tests/e2e/test_custom_task.py), `asyncgrpo stress` (tests/e2e/test_stress.py), a consumer and
producers on several hosts with their keys laid out as docs/running.md says
(tests/e2e/test_hosts.py), the recipes' `--dry-run` (tests/unit/test_recipes.py) and
`python bench/vs_loop.py` (tests/e2e/test_bench_vs_loop.py). `pytest -v tests/unit/test_docs.py`
lists every command checked, one test id per command.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import itertools
import re
import shlex
import tomllib
from pathlib import Path

import typer

from common import config as C
from launch.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REPO_DIRS = ("bench", "common", "consumer", "producer", "launch", "tests", "docs", ".ci")
PACKAGES = ("common", "consumer", "producer", "launch")
SHELL_LANGS = {"bash", "sh", "shell", "console"}
PROGRAMS = {"asyncgrpo", "python", "python3", "bash", "pip", "torchrun", "mutmut"}
CLI = typer.main.get_command(app)
RUN_REWARDS = {"launch", "producer", "stress", "eval"}  # commands that import them
# Written like a dotted name of ours but not one: config keys (`producer.max_in_flight`).
NOT_DOTTED = {key for key, *_ in C.field_help()}

FENCE = re.compile(r"^(```+|~~~+)\s*([\w-]*)")
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")
INLINE = re.compile(r"`([^`]+)`")
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:bench|common|consumer|producer|launch|tests|docs|\.ci)/[\w./-]*)"
)
DOTTED = re.compile(r"^(?:common|consumer|producer|launch)(?:\.\w+)+(?<!\.py)$")


# -- reading pages -------------------------------------------------------------------------------
def split_page(text: str) -> tuple[str, list[tuple[str, int, list[str]]]]:
    """The prose (fenced blocks blanked, line numbers kept) and the fenced blocks as
    (language, line of the first code line, lines)."""
    prose, blocks, block = [], [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line.strip())
        if block is None and m:
            block = (m[1], m[2].lower(), n + 1, [])
            prose.append("")
        elif block is not None and line.strip().startswith(block[0]):
            blocks.append((block[1], block[2], block[3]))
            block = None
            prose.append("")
        elif block is not None:
            block[3].append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: links reduced to their text, lower case, punctuation
    dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().rstrip("#").strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in split_page(text)[0].splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            s = slug(m[1])
            out.add(f"{s}-{seen[s]}" if s in seen else s)
            seen[s] = seen.get(s, 0) + 1
    return out


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


# -- links ---------------------------------------------------------------------------------------
def link_problems(page: Path, text: str) -> list[str]:
    """Relative links of `text` (the page at `page`) that lead nowhere."""
    prose, _ = split_page(text)
    out = []
    for m in LINK.finditer(prose):
        target = m[2]
        if re.match(r"^[a-z]+:", target):  # https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        where = f"{page.relative_to(ROOT)}:{line_of(prose, m.start())} ({target})"
        if not path_part:  # a heading of this very page
            if anchor not in anchors(text):
                out.append(f"{where}: no heading #{anchor} on this page")
            continue
        dest = (page.parent / path_part).resolve()
        if not dest.exists() or ROOT not in (dest, *dest.parents):
            out.append(f"{where}: no such file or directory")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest.read_text())):
            out.append(f"{where}: no heading #{anchor} there")
    return out


# -- commands ------------------------------------------------------------------------------------
def shell_commands(page: Path, text: str) -> list[tuple[str, str]]:
    """(where, command) for every command shown: lines of shell code blocks (continuations
    joined, `$ ` prompts of console blocks) and inline code spans that start with a program of
    ours or one that runs our files."""
    prose, blocks = split_page(text)
    name = page.relative_to(ROOT) if ROOT in page.parents else page.name
    out = []
    for lang, first, lines in blocks:
        if lang not in SHELL_LANGS and not (lang == "" and _starts_with_program(lines)):
            continue
        joined, start = "", first
        for n, line in enumerate(lines, first):
            if lang == "console":
                if not line.startswith("$ ") and not joined:
                    continue
                line = line.removeprefix("$ ")
            if not joined:
                start = n
            if line.rstrip().endswith("\\"):
                joined += line.rstrip()[:-1] + " "
                continue
            joined += line
            if joined.strip() and not joined.strip().startswith("#"):
                out.append((f"{name}:{start}", joined.strip()))
            joined = ""
    for m in INLINE.finditer(prose):
        span = " ".join(m[1].split())
        words = [w for w in span.split() if not re.match(r"^[A-Z_]+=", w)]
        script = len(words) > 1 and re.fullmatch(r"(bench|tests)/[\w/]+\.py", words[0])
        if words and (words[0] in PROGRAMS or script):
            out.append((f"{name}:{line_of(prose, m.start())} (inline)", span))
    return out


def _starts_with_program(lines: list[str]) -> bool:
    """A code block with no language whose first line of code runs a program of ours: shown
    as commands, so checked as a `bash` block is."""
    code = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    return bool(code) and code[0].removeprefix("$ ").split()[0] in PROGRAMS


def simple_commands(command: str) -> list[list[str]]:
    """`command` cut at `&&`, `||`, `;`, `|`, `&` into argument lists, comments and redirections
    dropped."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    out: list[list[str]] = [[]]
    redirected = False  # the rest of a simple command after `>` or `<` is not its arguments
    for token in lex:
        if token in ("&&", "||", ";", "|", "&"):
            out.append([])
            redirected = False
        elif re.fullmatch(r"[<>&]+", token) or redirected:
            redirected = True
        else:
            out[-1].append(token)
    return [c for c in out if c]


def cli_problem(args: list[str]) -> str | None:
    """What is wrong with `asyncgrpo ARGS` as an invocation (None: it parses)."""
    cmd, path = CLI, ["asyncgrpo"]
    args = [a for a in args if a != "..."]  # "the other arguments, as before"
    while hasattr(cmd, "commands"):
        if not args or args[0] == "--help":
            return None
        if args[0] not in cmd.commands:
            return f"`{' '.join(path)}` has no command {args[0]!r} ({', '.join(cmd.commands)})"
        path.append(args[0])
        cmd, args = cmd.commands[args[0]], args[1:]
    parser = cmd.make_parser(cmd.context_class(cmd, info_name=path[-1]))
    try:
        _, rest, _ = parser.parse_args(list(args))
    except Exception as exc:  # the CLI's click raises UsageError subclasses here
        if "UsageError" not in {c.__name__ for c in type(exc).__mro__}:
            raise
        return f"`{' '.join(path)}`: {exc}"
    return f"`{' '.join(path)}`: unexpected arguments {rest}" if rest else None


def options(args: list[str]) -> list[str]:
    return [a.split("=")[0] for a in args if a.startswith("--") and len(a) > 2]


def script_problem(path: str, args: list[str]) -> str | None:
    """A script (python, torchrun or bash) that must exist and define every option used."""
    file = ROOT / path
    if not file.is_file():
        return f"no such file {path}"
    source = file.read_text()
    missing = [o for o in options(args) if not re.search(rf"(?<![\w-]){o}(?![\w-])", source)]
    return f"{path} defines no option {', '.join(missing)}" if missing else None


def module_problem(module: str, args: list[str]) -> str | None:
    if module == "launch.cli":
        return cli_problem(args)
    try:
        found = importlib.util.find_spec(module)
    except ImportError:
        found = None
    return None if found is not None else f"no module {module}"


def program_problem(words: list[str]) -> str | None:
    """The check for one simple command, by program."""
    prog, args = words[0], words[1:]
    if prog.endswith(".py"):  # `bench/learner_step.py --device cuda` in the prose: run by python
        return script_problem(prog, args)
    if prog == "asyncgrpo":
        return cli_problem(args)
    if prog in ("python", "python3", "torchrun"):
        if "-m" in args:
            i = args.index("-m")
            return module_problem(args[i + 1], args[i + 2 :]) if i + 1 < len(args) else "-m what?"
        scripts = [i for i, a in enumerate(args) if a.endswith(".py")]
        return script_problem(args[scripts[0]], args[scripts[0] + 1 :]) if scripts else None
    if prog == "bash" and args:
        return script_problem(args[0], args[1:])
    if prog == "pip" and args[:1] == ["install"]:
        return pip_problem(args[1:])
    if prog == "mutmut" and args[:1] == ["run"]:
        return mutmut_problem(args[1:])
    return None


def pip_problem(args: list[str]) -> str | None:
    declared = set(PYPROJECT["project"]["optional-dependencies"])
    for flag, value in itertools.pairwise(args):
        if flag == "-c" and not (ROOT / value).is_file():
            return f"no constraints file {value}"
        if flag == "-e" and (m := re.fullmatch(r"\.\[([\w,-]+)\]", value)):
            unknown = set(m[1].split(",")) - declared
            if unknown:
                return f"pyproject.toml declares no extra {', '.join(sorted(unknown))}"
    return None


def mutmut_problem(args: list[str]) -> str | None:
    mutated = [p.removesuffix(".py").replace("/", ".") for p in
               PYPROJECT["tool"]["mutmut"]["only_mutate"]]  # fmt: skip
    for pattern in (a for a in args if not a.startswith("-")):
        if not any(fnmatch.fnmatch(m, pattern) for m in mutated):
            return f"mutmut mutates no module matching {pattern!r} ([tool.mutmut] only_mutate)"
    return None


def path_problems(words: list[str]) -> list[str]:
    """Arguments (and VAR=value) naming a path in one of the repository's folders that is not
    there."""
    out = []
    for word in words:
        value = word.split("=", 1)[-1]
        ours = value.split("/")[0] in REPO_DIRS and "/" in value
        if ours and not re.search(r"[\[*$]", value) and not (ROOT / value).exists():
            out.append(f"no such path {value}")
    return out


def command_problems(command: str, *, mention: bool = False) -> list[str]:
    """What is wrong with `command`; a `mention` (an inline code span in the prose) may name an
    option without its value (`asyncgrpo stress --external-producers`)."""
    out = []
    for words in simple_commands(command):
        out += path_problems(words)
        while words and re.match(r"^[A-Za-z_]\w*=", words[0]):  # VAR=value before the program
            words = words[1:]
        if words and (problem := program_problem(words)):
            out.append(problem)
    return [p for p in out if not (mention and p.endswith("requires an argument."))]


def configured_commands(command: str) -> list[tuple[str, list[str], list[str] | None]]:
    """(the repository's config file named by `--config`, "" for none; the `--set` values; the
    folders of a `PYTHONPATH=` before it, None when the command runs no reward or environment)
    for each `asyncgrpo` command in `command` that names a config file of the repository or
    sets a key. A config of the reader's own (`mine.toml`) is not one of ours, nor a value
    written as a placeholder (`--set run.seed=S`): such a command is left out."""
    out = []
    for words in simple_commands(command):
        pythonpath = []
        while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
            name, value = words[0].split("=", 1)
            pythonpath += value.split(":") if name == "PYTHONPATH" else []
            words = words[1:]
        if "launch.cli" in words:
            words = ["asyncgrpo", *words[words.index("launch.cli") + 1 :]]
        if not words or words[0] != "asyncgrpo":
            continue
        config, sets = "", []
        for flag, value in itertools.pairwise(words):
            if flag in ("--config", "-c"):
                config = value
            elif flag in ("--set", "-s"):
                sets.append(value)
        ours = not config or (ROOT / config).is_file()
        placeholder = any(re.fullmatch(r"[A-Z][A-Z_]*", v.split("=", 1)[-1]) for v in sets)
        if ours and not placeholder and (config or sets):
            runs = words[1] in RUN_REWARDS
            out.append(
                (config, sets, [p for p in pythonpath if p not in ("", ".")] if runs else None)
            )
    return out


def prose_path_problems(page: Path, text: str) -> list[str]:
    """Repository paths and dotted names of ours in the prose that do not exist."""
    prose, _ = split_page(text)
    out = []
    for m in REPO_PATH.finditer(prose):
        path = m[1].rstrip(".,:;")
        if not (ROOT / path).exists():
            out.append(f"{page.relative_to(ROOT)}:{line_of(prose, m.start())}: no {path}")
    for m in INLINE.finditer(prose):
        if DOTTED.match(m[1]) and m[1] not in NOT_DOTTED and not resolves(m[1]):
            out.append(f"{page.relative_to(ROOT)}:{line_of(prose, m.start())}: no {m[1]}")
    return out


def resolves(dotted: str) -> bool:
    """`package.module[.attribute...]` names a module of ours and attributes it has."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for attr in parts[n:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def section(page: Path, heading: str) -> list[str]:
    """The lines of the first code block under `heading` of `page`."""
    text = page.read_text()
    after = text[text.index(f"# {heading}\n") :]
    return split_page(after)[1][0][2]


def tree_entries(lines: list[str]) -> set[str]:
    """Paths of a file tree written as `name   description`, two spaces of indentation per level
    (a line indented as deep as the descriptions continues the one above)."""
    stack: list[str] = []
    out = set()
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent >= 16:
            continue
        name = line.split()[0]
        depth = indent // 2
        stack = [*stack[:depth], name]
        out.add("".join(p if p.endswith("/") else p + "/" for p in stack).rstrip("/"))
    return out
