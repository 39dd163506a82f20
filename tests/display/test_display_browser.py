"""The HTML tree in a real browser: Debian's headless Chromium, driven by Playwright.

Skips when Chromium or Playwright is absent (`.ci/run` installs both). Writes a
screenshot to `$BOXWOOD_ARTIFACTS` (default: pytest's temporary folder).
"""

import os
import pathlib

import jax
import pytest

import boxwood as bw
from boxwood import nn

CHROMIUM = pathlib.Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        "no /usr/bin/chromium (apt-get install chromium)", allow_module_level=True
    )
sync_api = pytest.importorskip("playwright.sync_api")

ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


class Encoder(bw.Module):
    layers: list
    dropout: nn.Dropout


class Model(bw.Module):
    encoder: Encoder
    head: nn.Linear


def test_tree_expands_on_click_and_shows_leaves(tmp_path):
    keys = jax.random.split(jax.random.key(0), 3)
    model = Model(
        Encoder(
            [nn.Linear(8, 16, key=keys[0]), nn.Linear(16, 4, key=keys[1])],
            nn.Dropout(0.2),
        ),
        nn.Linear(4, 2, key=keys[2]),
    )
    page_html = f"<!doctype html><html><body>{model._repr_html_()}</body></html>"
    artifacts = pathlib.Path(os.environ.get("BOXWOOD_ARTIFACTS", tmp_path))
    artifacts.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=ARGS, headless=True
        )
        try:
            page = browser.new_page(viewport={"width": 900, "height": 600})
            page.set_content(page_html)
            leaf = page.get_by_text("weight: f32[16,8]")
            assert not leaf.is_visible()  # submodules start collapsed
            page.locator("summary", has_text="encoder: Encoder").click()
            page.locator("summary", has_text="layers: list[2]").click()
            assert not leaf.is_visible()
            page.locator("summary", has_text="0: Linear").click()
            assert leaf.is_visible()
            assert page.get_by_text("in_features = 8").is_visible()
            assert (
                page.locator("summary", has_text="Model")
                .first.inner_text()
                .endswith(
                    "222 params · 888 B"  # 8*16+16 + 16*4+4 + 4*2+2
                )
            )
            shot = artifacts / "module_html.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
