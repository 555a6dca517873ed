"""Sphinx configuration of the documentation site (docs/site.md says how it is built, and why).

The source directory is the repository's root, so that the Markdown pages keep the links they
have on GitHub (``docs/design.md#fair-claiming`` from the README, ``../bench/README.md`` from
``docs/scaling.md``) and MyST resolves them to pages of the site; the build fails on a broken one.

    sphinx-build -W --keep-going -c docs . build/docs
"""

from __future__ import annotations

import ast
import io
import os
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# autodoc imports the package, whose models and admin need a configured app registry, and no
# database: the smallest settings that give one, so the docs need nothing but the package.
import django  # noqa: E402
from django.conf import settings  # noqa: E402

if not settings.configured and "DJANGO_SETTINGS_MODULE" not in os.environ:
    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django_durable_scheduler",
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
django.setup()

import django_durable_scheduler  # noqa: E402

project = "django-durable-scheduler"
author = "django-durable-scheduler contributors"
copyright = "django-durable-scheduler contributors"
release = version = django_durable_scheduler.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc"]

root_doc = "README"
include_patterns = ["README.md", "CHANGELOG.md", "docs/*.md", "bench/README.md", "bench/log/*.md"]
exclude_patterns = [".*", "build", "dist", "**/__pycache__", "node_modules"]
source_suffix = {".md": "markdown"}

# The headings' anchors are the ones GitHub gives them, so ``page.md#heading`` links work in
# both places; an anchor that names no heading is a warning, like a missing page.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

html_theme = "furo"
html_title = f"django-durable-scheduler {release}"
html_copy_source = False
html_show_sourcelink = False
# Every asset is served from the build itself: the site, its search included, works offline.
html_theme_options: dict[str, Any] = {}

# The pages of the site, in four parts by what their reader is doing (learning, getting a task
# done, looking something up, understanding why), then the project's own pages. The README is the
# landing page. They are listed here rather than in the README so that it reads the same on GitHub.
PARTS = {
    "Tutorial": ["docs/tutorial"],
    "How-to guides": ["docs/operations", "docs/scaling", "docs/authority", "docs/tasks", "docs/testing"],
    "Reference": ["docs/reference", "docs/lifecycle", "docs/api"],
    "Discussions": ["docs/design", "bench/README"],
}
PROJECT = ["docs/contributing", "docs/site", "CHANGELOG"]


def _toctree_of(caption: str, pages: list[str]) -> str:
    return f"```{{toctree}}\n:hidden:\n:caption: {caption}\n:maxdepth: 2\n\n" + "\n".join(pages) + "\n```\n"


# bench/log/ holds one write-up per date: in the site they are pages under the benchmarks page,
# and a link to the folder (GitHub lists it) becomes its name, the sidebar listing the pages.
TOCTREES = {
    root_doc: "\n".join(_toctree_of(c, p) for c, p in [*PARTS.items(), ("Project", PROJECT)]),
    "bench/README": "```{toctree}\n:hidden:\n:glob:\n:reversed:\n\nlog/*\n```\n",
}
FOLDER_LINKS = {"bench/README": {"[log/](log/)": "`log/`"}}


def _toctree(app: Any, docname: str, source: list[str]) -> None:
    for link, text in FOLDER_LINKS.get(docname, {}).items():
        source[0] = source[0].replace(link, text)
    if docname in TOCTREES:
        source[0] += "\n\n" + TOCTREES[docname]


def _defaults() -> list[tuple[str, str, str]]:
    """``(name, default, what)`` for each setting of ``conf.DEFAULTS``, the comment above it
    being what it does: the reference reads the settings from the code that defines them."""
    path = ROOT / "django_durable_scheduler" / "conf.py"
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    node = next(
        n
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "DEFAULTS"
    )
    assert isinstance(node.value, ast.Dict)
    comments: dict[int, str] = {
        tok.start[0]: tok.string.lstrip("# ").strip()
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    }
    rows = []
    previous_end, what = node.lineno, ""
    for key, value in zip(node.value.keys, node.value.values, strict=True):
        assert isinstance(key, ast.Constant)
        above = [comments[n] for n in range(previous_end + 1, key.lineno) if n in comments]
        # A comment above several settings (the retry backoff's three) is about each of them.
        what = " ".join(above) or what
        # The value's first line lost its indentation to the key: its other lines lose it too.
        first, _, rest = (ast.get_source_segment(text, value) or "").partition("\n")
        default = first + ("\n" + textwrap.dedent(rest) if rest else "")
        rows.append((str(key.value), default, what))
        previous_end = value.end_lineno or key.lineno
    return rows


def _settings() -> str:
    out = ["| setting | default | what it does |", "| --- | --- | --- |"]
    for name, default, what in _defaults():
        shown = f"`{default}`" if "\n" not in default else "a dict (below)"
        out.append(f"| `DURABLE_SCHEDULER_{name}` | {shown} | {what.replace('|', '/')} |")
    for name, default, _ in _defaults():
        if "\n" in default:
            out += ["", f"`DURABLE_SCHEDULER_{name}`'s default, with what each key means:", ""]
            out += ["```python", default, "```"]
    return "\n".join(out)


def _commands() -> str:
    """Each management command's help, as ``manage.py help <command>`` prints it."""
    from django.core.management import load_command_class

    from django_durable_scheduler.management import commands

    out = []
    names = sorted(p.stem for p in Path(commands.__file__).parent.glob("*.py") if p.stem != "__init__")
    for name in names:
        command = load_command_class("django_durable_scheduler", name)
        parser = command.create_parser("manage.py", name)
        out += [f"### `{name}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def _error_codes() -> str:
    """Each exception of the API with its stable code, from the classes themselves."""
    from django_durable_scheduler.exceptions import SchedulerError

    scheduler = django_durable_scheduler

    out = ["| code | exception |", "| --- | --- |"]
    for name in scheduler.__all__:
        value = getattr(scheduler, name)
        if isinstance(value, type) and issubclass(value, SchedulerError):
            out.append(f"| `{value.code}` | {{class}}`{name}` |")
    return "\n".join(out)


GENERATED = {
    "<!-- settings -->": _settings,
    "<!-- commands -->": _commands,
    "<!-- error codes -->": _error_codes,
}


def _generate(app: Any, docname: str, source: list[str]) -> None:
    for marker, make in GENERATED.items():
        if marker in source[0]:
            source[0] = source[0].replace(marker, make())


def _landing_page(app: Any, exception: Exception | None) -> None:
    """``index.html`` leads to the README's page, where a host or a browser looks first."""
    if exception is None and app.builder.format == "html":
        target = f"{root_doc}.html"
        Path(app.outdir, "index.html").write_text(
            f'<!DOCTYPE html><meta charset="utf-8"><title>{project}</title>'
            f'<meta http-equiv="refresh" content="0; url={target}"><a href="{target}">{project}</a>\n',
            encoding="utf-8",
        )


def setup(app: Any) -> None:
    from pygments.lexers.special import TextLexer

    # lifecycle.md's diagram is a Mermaid block: GitHub draws it; the site shows its
    # text, since drawing it needs a script that the site would have to fetch.
    app.add_lexer("mermaid", TextLexer)
    app.connect("source-read", _toctree)
    app.connect("source-read", _generate)
    app.connect("build-finished", _landing_page)
