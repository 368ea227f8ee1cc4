"""The page of ``graphsvc view`` in a real browser: headless Chromium driven by Playwright.

``graphsvc view FILE --no-browser`` runs as a process; the page it serves is loaded, clicked, searched
and coloured, and every request it makes is recorded: all go to the server's own address (nothing is
fetched from anywhere else). Skipped where Chromium or playwright is missing, except with
GRAPHSVC_REQUIRE_BROWSER=1 (as .ci/run sets it). With GRAPHSVC_SCREENSHOTS=1 the test of the generated
graph saves docs/images/view.png (a group open, the |grad| overlay on).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphsvc
from benchmarks.bench_view_page import ARGS  # how Chromium runs here: no sandbox, nothing fetched
from graphsvc import format as fmt
from graphsvc.graph import GraphBuilder
from tests.conftest import CHROMIUM, ROOT

pytestmark = pytest.mark.usefixtures("browser_available")

TOP_MODULES = ["encoder.layers", "head", "loss", "x"]
ENCODER = "encoder.layers"
ENCODER_CHILDREN = ["0", "1"]
#: micrograd_mlp.msgpack: w2 holds one neuron (merged: w2.0); unnamed nodes in range groups of node ids
TOP_MLP = ["w2.0", "w1", "w0", "#3–179", "b0", "b1", "b2", "#180–308", "#311–393"]
W1_CHILDREN = ["3", "0", "1", "2"]
SCRIPT_NAME = "head.<script>alert(1)</script>"


def module_graph(path: Path, head: float = 2.0) -> Path:
    """A small model with module-path names (two encoder layers and a head), float32 [2, 3] tensors,
    its gradients computed, and a node whose name holds markup."""
    b = GraphBuilder()
    h = x = b.leaf(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), name="x")
    for i in range(2):
        w = b.leaf(np.full((2, 3), 0.5 + i, dtype=np.float32), name=f"encoder.layers.{i}.linear.weight")
        bias = b.leaf(np.full((2, 3), 0.1, dtype=np.float32), name=f"encoder.layers.{i}.linear.bias")
        m = b.add("mul", [h, w], name=f"encoder.layers.{i}.linear.mul")
        a = b.add("add", [m, bias], name=f"encoder.layers.{i}.linear.add")
        h = b.add("tanh", [a], name=f"encoder.layers.{i}.act.tanh")
    head = b.add("mul", [h, b.leaf(np.full((2, 3), head, dtype=np.float32), name="head.weight")], name="head.mul")
    loss = b.add("sum", [b.add("tanh", [head], name=SCRIPT_NAME)], name="loss")
    assert x == 0
    fmt.save(graphsvc.backward(b.build(outputs=[loss])), path)
    return path


class Served:
    """``graphsvc view FILE --no-browser`` in its own process, and Chromium on its page."""

    def __init__(self, file: Path, playwright: Any, *more: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "graphsvc", "--disable-plugins", "view", file.name, *map(str, more), "--no-browser"],
            cwd=file.parent,  # the page's title shows the file as given: its name
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:(\d+)/)$", line.strip())
        assert found, line
        self.url = found.group(1)
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        self.page = self.browser.new_page(viewport={"width": 1280, "height": 800})
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready='1']", timeout=60_000)

    def close(self) -> tuple[int, str]:
        self.browser.close()
        self.process.terminate()
        _, err = self.process.communicate(timeout=20)
        return self.process.returncode, err

    # -- what the page shows -------------------------------------------------------------------
    def labels(self, parent: str = "") -> list[str]:
        """The first line of each item drawn inside ``parent`` (a key; "" the top level), in page order."""
        texts = self.page.locator(f'svg .item[data-parent="{parent}"]').evaluate_all(
            "items => items.map(g => g.querySelector('text').textContent)"
        )
        return [text.removeprefix("▾ ") for text in texts]

    def key_of(self, label: str) -> str:
        keys = self.page.locator("svg .item").evaluate_all(
            "(items, label) => items.filter(g => g.querySelector('text').textContent.replace(/^▾ /, '') === label)"
            ".map(g => g.dataset.key)",
            label,
        )
        assert len(keys) == 1, (label, keys)
        return str(keys[0])

    def item(self, label: str) -> Any:
        return self.page.locator(f'svg .item[data-key="{self.key_of(label)}"]')

    def settle(self) -> None:
        """Wait for the view's queue of fetch, layout and draw to be done."""
        self.page.wait_for_function("document.getElementById('status').textContent.includes('layout')")
        self.page.evaluate("() => pending")


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        yield driver


@pytest.fixture
def mlp(playwright: Any) -> Iterator[Served]:
    served = Served(ROOT / "examples" / "micrograd_mlp.msgpack", playwright)
    yield served
    assert served.close()[1] == ""


@pytest.fixture
def modules(playwright: Any, tmp_path: Path) -> Iterator[Served]:
    served = Served(module_graph(tmp_path / "model.msgpack"), playwright)
    yield served
    assert served.close()[1] == ""


def only_to_the_server(served: Served) -> None:
    assert served.requests, "no request recorded"
    assert [url for url in served.requests if not url.startswith(served.url)] == []
    assert served.errors == []


def test_the_example_mlp_shows_its_top_level_groups_and_opens_one(mlp: Served) -> None:
    page = mlp.page
    assert page.text_content("#status").startswith("394 nodes · ")
    assert sorted(mlp.labels()) == sorted(TOP_MLP)
    w1 = mlp.item("w1")
    assert (w1.get_attribute("role"), w1.get_attribute("tabindex")) == ("button", "0")
    w1.click()
    mlp.settle()
    assert sorted(mlp.labels(mlp.key_of("w1"))) == sorted(W1_CHILDREN)
    assert mlp.page.locator(f'svg .item[data-key="{mlp.key_of("w1")}"]').get_attribute("class") == "item group open"
    only_to_the_server(mlp)


def test_two_files_the_diff_overlay_colours_what_differs_and_the_details_say_how(
    playwright: Any, tmp_path: Path
) -> None:
    a = module_graph(tmp_path / "a.msgpack")
    b = module_graph(tmp_path / "b.msgpack", head=3.0)  # the head's weight: its values and every gradient
    served = Served(a, playwright, b)
    try:
        page = served.page
        page.select_option("#overlay", "diff")
        fill = "key => document.querySelector(`svg .item[data-key='${key}'] > rect`).style.fill"
        assert page.evaluate(fill, served.key_of("x")) == "rgb(116, 192, 252)"  # its gradient differs
        assert page.evaluate(fill, served.key_of("head")) == "rgb(255, 169, 77)"  # a group holding some
        assert page.text_content("#legend").startswith("differs in")
        served.item("x").click()
        page.wait_for_selector("#detail dl")
        rows = page.locator("#detail dt").all_text_contents()
        said = page.locator("#detail dd").all_text_contents()[rows.index("diff")]
        assert said == "grads (B's node 0); grad: float32[2, 3] max|a-b|=0.612168 at [0, 0]"
        only_to_the_server(served)
    finally:
        assert served.close()[1] == ""


def test_a_graph_under_one_scope_opens_to_what_the_scope_holds(playwright: Any, tmp_path: Path) -> None:
    b = GraphBuilder()
    x, w = b.leaf(1.0, name="net.x"), b.leaf(2.0, name="net.w")
    y = b.add("tanh", [b.add("mul", [x, w], name="net.mul")], name="net.tanh")
    fmt.save(graphsvc.backward(b.build(outputs=[y])), tmp_path / "net.msgpack")
    served = Served(tmp_path / "net.msgpack", playwright)
    try:
        assert served.labels() == ["net"]
        assert served.item("net").get_attribute("class") == "item group open"
        assert sorted(served.labels(served.key_of("net"))) == ["net.mul", "net.tanh", "net.w", "net.x"]
        only_to_the_server(served)
    finally:
        assert served.close()[1] == ""


def test_a_group_opens_from_the_keyboard_and_closes_from_its_header(mlp: Served) -> None:
    mlp.item("w0").focus()
    mlp.page.keyboard.press("Enter")
    mlp.settle()
    key = mlp.key_of("w0")
    assert mlp.labels(key) != []
    mlp.page.locator(f'svg .item[data-key="{key}"] > .header').click()
    mlp.settle()
    assert mlp.labels(key) == []
    assert mlp.page.locator(f'svg .item[data-key="{key}"]').get_attribute("class") == "item group closed"
    only_to_the_server(mlp)


def test_modules_search_reveals_highlights_and_details_a_node_whose_name_holds_markup(modules: Served) -> None:
    page = modules.page
    assert sorted(modules.labels()) == sorted(TOP_MODULES)
    modules.item(ENCODER).click()
    modules.settle()
    assert modules.labels(modules.key_of(ENCODER)) == ENCODER_CHILDREN

    page.fill("#search", "<script>")
    page.wait_for_selector("#results button")
    assert page.locator("#results button").all_text_contents() == [f"{SCRIPT_NAME} (tanh)"]
    page.locator("#results button").click()
    page.wait_for_selector("svg .item.highlight")
    modules.settle()
    page.wait_for_selector("#detail dl")
    highlighted = page.locator("svg .item.highlight")
    assert highlighted.count() == 1
    assert highlighted.locator("text").first.text_content() == SCRIPT_NAME  # as text, not markup
    assert page.locator("script").count() == 2  # the page's own two, nothing from the file
    assert page.locator("#detail h2").text_content() == SCRIPT_NAME
    details = dict(
        zip(page.locator("#detail dt").all_text_contents(), page.locator("#detail dd").all_text_contents(), strict=True)
    )
    shown = (details["op"], details["dtype"], details["shape"], details["name"])
    assert shown == ("tanh", "float32", "[2, 3]", SCRIPT_NAME)
    assert details["parents"] == "head.mul (mul)"
    only_to_the_server(modules)


def test_modules_the_grad_overlay_colours_items_and_shows_its_legend(modules: Served, tmp_path: Path) -> None:
    page = modules.page
    fills = "() => [...document.querySelectorAll('svg .item:not(.open) > rect')].map(r => r.style.fill)"
    assert set(page.evaluate(fills)) == {""}
    assert page.text_content("#legend") == ""
    modules.item(ENCODER).click()
    modules.settle()
    page.select_option("#overlay", "grad")
    coloured = page.evaluate(fills)
    assert "" not in coloured and len(set(coloured)) > 2
    assert page.text_content("#legend").startswith("max |grad|")
    page.select_option("#overlay", "none")
    assert set(page.evaluate(fills)) == {""}
    if os.environ.get("GRAPHSVC_SCREENSHOTS") == "1":
        page.select_option("#overlay", "grad")
        page.locator("#fit").click()
        page.screenshot(path=str(ROOT / "docs" / "images" / "view.png"))
    only_to_the_server(modules)
