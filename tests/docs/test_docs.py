"""The documentation site covers the public API (`mkdocs build --strict` runs in
`.ci/run`; these checks are fast and catch a new name without a reference entry)."""

import pathlib
import re
import types

import boxwood
import boxwood.models
import boxwood.nn
import boxwood.random

ROOT = pathlib.Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api"


def public_names(module: types.ModuleType) -> set[str]:
    return {
        name
        for name in dir(module)
        if not name.startswith("_")
        and not isinstance(getattr(module, name), types.ModuleType)
    }


def documented() -> set[str]:
    text = "\n".join(p.read_text() for p in API.glob("*.md"))
    return set(re.findall(r"^::: (boxwood\.[\w.]+)$", text, re.M))


def test_every_public_name_has_an_api_entry():
    wanted = {f"boxwood.{n}" for n in public_names(boxwood)}
    wanted |= {f"boxwood.nn.{n}" for n in public_names(boxwood.nn)}
    wanted |= {f"boxwood.random.{n}" for n in public_names(boxwood.random)}
    wanted |= {f"boxwood.models.{n}" for n in public_names(boxwood.models)}
    missing = wanted - documented()
    assert not missing, f"add these to a page in docs/api/: {sorted(missing)}"


def test_api_entries_name_real_objects():
    for dotted in documented():
        obj = boxwood
        for part in dotted.split(".")[1:]:
            obj = getattr(obj, part)  # AttributeError names a stale entry


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert not {p for p in pages if f": {p}" not in nav}


def test_error_catalogue_names_every_error_class_and_warning():
    text = (ROOT / "docs" / "errors.md").read_text()
    for name in ("CheckpointError", "RecompileWarning", "PerformanceWarning"):
        assert f"`boxwood.{name}`" in text


def test_the_home_page_links_every_page_once():
    index = (ROOT / "docs" / "index.md").read_text()
    pages = sorted(
        str(p.relative_to(ROOT / "docs"))
        for p in (ROOT / "docs").rglob("*.md")
        if p.name != "index.md" and "_ext" not in p.parts
    )
    links = re.findall(r"\]\(([\w/.-]+\.md)(?:#[\w-]*)?\)", index)
    assert [p for p in pages if p not in links] == []
    assert [link for link in set(links) if links.count(link) > 1] == []


def test_api_pages_show_signatures_not_implementation():
    # mkdocstrings: no `self.weight = init_param(...)` values shown as defaults of
    # fields, one signature per function (not filter_jit's overloads)
    config = (ROOT / "mkdocs.yml").read_text()
    assert "show_attribute_values: false" in config
    assert "show_overloads: false" in config


def test_every_mkdocs_command_silences_the_mkdocs_2_notice():
    texts = [(ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()]
    texts += [p.read_text() for p in (ROOT / "docs").glob("*.md")]
    for text in texts:
        pattern = r"(?:NO_MKDOCS_2_WARNING=1 )?(?:python -m )?mkdocs (?:build|serve)"
        for command in re.findall(pattern, text):
            assert command.startswith("NO_MKDOCS_2_WARNING=1 "), command
