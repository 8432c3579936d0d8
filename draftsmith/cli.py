"""The ``draftsmith`` command: a table of subcommands; each one's logic lives in its own module."""

from __future__ import annotations

import sys
from pathlib import Path

from draftsmith.errors import DraftsmithError


def target_build(out: Path | None = None, fast: bool = False, force: bool = False) -> Path:
    """Build the embedded default target (tokenizer + small Llama trained on the stdlib's source).

    Args:
        out: where to save it (default: the cache, keyed by the build config).
        fast: the seconds-long test build instead of the default.
        force: rebuild even if a build exists.
    """
    from draftsmith import default_target

    config = default_target.FAST if fast else default_target.TargetBuildConfig()
    path = default_target.build(config, out, force)
    print(path)
    return path


def _commands() -> dict:
    from draftsmith.data.generate import generate
    from draftsmith.eval.score import score
    from draftsmith.quickstart import quickstart

    return {"target": {"build": target_build}, "generate": generate, "score": score, "quickstart": quickstart}


def _normalize(argv: list[str]) -> list[str]:
    """Accept ``--max-new-tokens`` for ``--max_new_tokens``, ``-k`` for ``--k``, bare ``--flag`` for ``--flag=true``."""
    out = []
    for i, arg in enumerate(argv):
        if arg == "-k":
            arg = "--k"
        elif arg.startswith("--") and not arg.startswith("--print_") and arg not in ("--help",):
            name, eq, value = arg[2:].partition("=")
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            bare = not eq and (nxt is None or (nxt.startswith("-") and not nxt.lstrip("-").replace(".", "").isdigit()))
            arg = "--" + name.replace("-", "_") + (eq + value if eq else ("=true" if bare else ""))
        out.append(arg)
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "fit":
        from draftsmith.train.cli import fit_main

        fit_main(argv[1:])
        return
    from jsonargparse import CLI

    try:
        CLI(_commands(), args=_normalize(argv), as_positional=False)
    except DraftsmithError as e:
        print(f"draftsmith: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
