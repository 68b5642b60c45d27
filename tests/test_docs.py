"""The docs stand alone and match the code: every relative link resolves inside the repository,
nothing points outside it, and every option docs/CLI.md names exists on its command."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from groklens.cli import cli as main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve_inside_the_repository(doc):
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{doc.name}: link {target} does not resolve"
        assert ROOT in path.parents or path == ROOT, f"{doc.name}: link {target} leaves the repository"


def test_nothing_cites_files_outside_the_repository():
    files = DOCS + [p for room in ("groklens", "trainers", "checkpoints", "probes", "analyses", "benchmarks")
                    for p in (ROOT / room).rglob("*.py")]
    offenders = [f"{p.relative_to(ROOT)}" for p in files if "../shared" in p.read_text()]
    assert not offenders, f"these cite ../shared, which a user's clone does not have: {offenders}"


def _options(cmd: click.Command) -> set[str]:
    names = {"--help"}
    for param in cmd.params:
        names.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("--"))
    return names


def test_every_option_in_cli_md_exists_on_its_command():
    """Options in a section's synopsis (the `groklens NAME ...` lines of its code blocks) must be
    options of that command; an option named in prose must be an option of some command."""
    text = (ROOT / "docs" / "CLI.md").read_text()
    commands = main.commands
    every = set().union(*(_options(c) for c in commands.values()), _options(main))
    opt = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
    checked = 0
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        name = section.split("\n", 1)[0].strip().split()[0].strip("`")
        for block in re.findall(r"```[a-z]*\n(.*?)```", section, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = line.split()
                if len(words) < 2 or words[0] != "groklens" or words[1] not in commands:
                    continue
                known = _options(commands[words[1]]) | _options(main)
                for o in opt.findall(line):
                    assert o in known, f"docs/CLI.md ## {name}: {o} is not an option of `groklens {words[1]}`"
                    checked += 1
        for o in opt.findall(section):
            assert o in every, f"docs/CLI.md ## {name}: {o} is not an option of any command"
    assert checked > 30  # the synopses were found and read
