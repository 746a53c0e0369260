"""The documentation site builds with ``mkdocs build --strict`` (no page links to nothing, no anchor is missing,
the generated pages are generated), and a broken link fails that build."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from embedstream.docsite.settings_reference import settings

ROOT = Path(__file__).resolve().parents[2]


def _build(config_dir: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's banner about MkDocs 2.0: noise in the output
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=config_dir, env=env, capture_output=True, text=True, timeout=600)


def test_the_site_builds_strict_with_the_generated_reference(tmp_path):
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-4000:]
    reference = (tmp_path / "site" / "reference" / "configuration" / "index.html").read_text()
    assert "settings-reference" not in reference  # the marker was replaced
    missing = [row.env for row in settings() if row.env.strip("`") not in reference]
    assert missing == [], f"settings missing from the built reference: {missing}"


def test_a_link_to_nothing_fails_the_build(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    for extra in ("README.md",):  # files the site includes from outside docs/
        if (ROOT / extra).exists():
            shutil.copy(ROOT / extra, copy / extra)
    page = copy / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[lanes](concepts/lanes.md#no-such-heading) [gone](no-such-page.md)\n")
    done = _build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-heading" in done.stderr and "no-such-page.md" in done.stderr, done.stderr[-4000:]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_the_readme_is_a_front_page_with_the_two_commands_first():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    commands = [line.split("#")[0].strip() for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
                for line in block.splitlines() if line.split("#")[0].strip()]
    assert commands[:2] == ["bash scripts/demo.sh", "bash scripts/test.sh"]


def test_the_readmes_links_resolve():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local, "the README links into the documentation"
    for link in local:
        path, _, anchor = link.partition("#")
        target = (ROOT / path) if path else ROOT / "README.md"
        assert target.exists(), f"README links to {link}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, f"README links to {link}: no such heading"
