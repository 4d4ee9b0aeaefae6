"""Generate docs/reference/cli.md from the commands' own help (Click).

Usage: python -m nestrace.cli.reference [--check]
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from nestrace.cli import main as _main  # noqa: F401  (every command registered)
from nestrace.cli.common import cli

TARGET = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"


def _commands(group: click.Group, prefix: str) -> list[tuple[str, click.Command]]:
    out = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):    # (imports common.ELSEWHERE's)
        cmd = group.get_command(ctx, name)
        out.append((f"{prefix} {name}", cmd))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, f"{prefix} {name}")
    return out


def reference_markdown() -> str:
    lines = ["# Command reference", "",
             "GENERATED from the commands' own `--help` by `python -m nestrace.cli.reference`;",
             "`ci/check-generated` fails on drift.", ""]
    for path, cmd in _commands(cli, "nestrace"):
        ctx = click.Context(cmd, info_name=path, terminal_width=80, max_content_width=80)
        lines += [f"## `{path}`", "", "```text", cmd.get_help(ctx).rstrip(), "```", ""]
    return "\n".join(lines)


def main() -> int:
    text = reference_markdown()
    if "--check" in sys.argv:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET}: drifted from the commands' help; run "
                  "python -m nestrace.cli.reference", file=sys.stderr)
            return 1
        print("check-generated: docs/reference/cli.md matches the commands")
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
