"""The documentation site builds with warnings as errors (``mkdocs build --strict``, as a reader
or CI runs it from the repository's root): every page of docs/ in it, every link between them
found, and an API reference generated from the docstrings that documents every name of
``segue``'s face, every name of its submodules (``segue.core``, ``segue.effects``,
``segue.updates``, ``segue.errors``, ``segue.adapters``) and every public method of ``Runtime``
(``Runtime.conversation(id)`` was once in no doc, found only with ``help()``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import segue
import segue.adapters
import segue.core
import segue.effects
import segue.errors
import segue.server
import segue.updates
import segue.views

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built strictly into a temporary folder (the repository is left as it was)."""
    built = tmp_path_factory.mktemp("site")
    ran = subprocess.run(  # noqa: S603  # this interpreter's mkdocs, no shell
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "WARNING" not in ran.stderr, ran.stderr
    return built


def anchors(page: Path) -> set[str]:
    return set(re.findall(r'id="([\w.]+)"', page.read_text(encoding="utf-8")))


def test_every_page_of_docs_is_in_the_site(site: Path) -> None:
    pages = sorted(path.stem for path in (ROOT / "docs").glob("*.md"))
    assert "reference" in pages
    for stem in pages:
        built = site / ("index.html" if stem == "index" else f"{stem}/index.html")
        assert built.is_file(), stem


def test_the_reference_documents_every_public_name_and_runtime_method(site: Path) -> None:
    found = anchors(site / "reference" / "index.html")
    assert {f"segue.{name}" for name in segue.__all__} - found == set()
    methods = {name for name in dir(segue.Runtime) if not name.startswith("_")}
    assert {"conversation", "create_conversation", "send", "stream", "state"} <= methods
    assert {f"segue.Runtime.{name}" for name in methods} - found == set()
    for module in (
        segue.core,
        segue.effects,
        segue.updates,
        segue.errors,
        segue.adapters,
        segue.views,
        segue.server,
    ):
        names = {f"{module.__name__}.{name}" for name in module.__all__}
        assert names - found == set(), module.__name__


def test_the_reference_says_what_the_docstrings_say(site: Path) -> None:
    text = (site / "reference" / "index.html").read_text(encoding="utf-8")
    said = segue.Runtime.conversation.__doc__
    assert said is not None
    first = " ".join(said.split())[:40]
    plain = " ".join(re.sub(r"<[^>]+>", "", text).split())
    assert first.replace("``", "") in plain.replace("``", ""), first


def test_no_page_links_outside_the_repository(site: Path) -> None:
    """Relative links resolve to a page or file of docs/ (strict mode checks them); none
    climbs out of the site to a file beside the repository."""
    for page in site.rglob("*.html"):
        if page.name == "404.html":
            continue  # served at any depth, so its links start at the root: "/css/..."
        hrefs = re.findall(r'href="([^"#]+)"', page.read_text(encoding="utf-8"))
        for href in hrefs:
            if re.match(r"^[a-z]+:", href):
                continue  # an address on the web
            target = (page.parent / href).resolve()
            assert target.is_relative_to(site), (page, href)
