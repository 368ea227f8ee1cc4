"""The page of ``graphsvc view`` in headless Chromium: layout time and time to first view.

1. Layout: elkjs (the vendored bundle) on synthetic graphs of 200, 1,000 and 3,000 items (a random
   layered DAG, ~1.3 edges an item), flat and with items nested in containers of 20 (open groups);
   with ``--dagre FILE`` (dagre's dist/dagre.min.js, e.g. from ``npm pack dagre``) dagre on the same.
2. Time to first view: ``graphsvc view FILE --no-browser`` on a chain of ``--nodes`` nodes (1,000,000
   by default) named like a model's modules (``layers.L.blockB.stepS.OP``), from process start to the
   items drawn; then one group opened (click to drawn) and the layout time the page reports.

Needs Chromium (``--chromium``, /usr/bin/chromium by default) and the playwright package.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ELK = ROOT / "graphsvc" / "view" / "static" / "vendor" / "elk.bundled.js"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

#: Builds a seeded random layered graph of n items (nested in containers of `nest` when nest > 0)
#: and times one layout with `engine` ("elk" or "dagre"); resolves to milliseconds.
LAYOUT_JS = """
async ([engine, n, nest]) => {
  let seed = 12345;
  const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
  const items = [];
  for (let i = 0; i < n; i++) items.push({ id: "n" + i, width: 150, height: 52 });
  const edges = [];
  for (let i = 1; i < n; i++) {
    edges.push(["n" + Math.floor(rand() * i), "n" + i]);
    if (rand() < 0.3) edges.push(["n" + Math.floor(rand() * i), "n" + i]);
  }
  const started = performance.now();
  if (engine === "elk") {
    const root = { id: "root", children: [], edges: [], layoutOptions: {
      "elk.algorithm": "layered", "elk.direction": "DOWN", "elk.hierarchyHandling": "INCLUDE_CHILDREN",
      "elk.edgeRouting": "ORTHOGONAL", "elk.json.shapeCoords": "ROOT", "elk.json.edgeCoords": "ROOT" } };
    if (nest) {
      for (let g = 0; g * nest < n; g++) {
        root.children.push({ id: "g" + g, layoutOptions: { "elk.padding": "[top=34,left=10,bottom=10,right=10]" },
          children: items.slice(g * nest, (g + 1) * nest) });
      }
    } else root.children = items;
    edges.forEach(([s, t], i) => root.edges.push({ id: "e" + i, sources: [s], targets: [t] }));
    await new ELK().layout(root);
  } else {
    const g = new dagre.graphlib.Graph({ compound: !!nest });
    g.setGraph({ rankdir: "TB" });
    g.setDefaultEdgeLabel(() => ({}));
    items.forEach((item, i) => {
      g.setNode(item.id, { width: item.width, height: item.height });
      if (nest) { g.setNode("g" + Math.floor(i / nest), {}); g.setParent(item.id, "g" + Math.floor(i / nest)); }
    });
    edges.forEach(([s, t]) => g.setEdge(s, t));
    dagre.layout(g);
  }
  return performance.now() - started;
}
"""


def layouts(playwright: object, chromium: str, sizes: list[int], dagre: Path | None) -> None:
    browser = playwright.chromium.launch(executable_path=chromium, args=ARGS)  # type: ignore[attr-defined]
    page = browser.new_page()
    page.goto("about:blank")
    page.add_script_tag(path=str(ELK))
    engines = ["elk"]
    if dagre is not None:
        page.add_script_tag(path=str(dagre))
        engines.append("dagre")
    print("layout in headless Chromium (ms, best of 3)")
    for engine in engines:
        for nest in (0, 20):
            for n in sizes:
                best = min(page.evaluate(LAYOUT_JS, [engine, n, nest]) for _ in range(3))
                kind = f"in containers of {nest}" if nest else "flat"
                print(f"  {engine:6} {n:>6,} items {kind:22} {best:9.0f}")
    browser.close()


def big_graph(nodes: int, path: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from benchmarks import graphs
    from graphsvc import format as fmt

    graph = graphs.chain(nodes)
    ops = graph.op_table
    graph.names = {
        i: f"layers.{i // 10_000}.block{(i // 100) % 100}.step{i % 100}.{ops[int(graph.op_codes[i])]}"
        for i in range(graph.num_nodes)
    }
    fmt.save(graph, path)
    return path


def first_view(playwright: object, chromium: str, nodes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        file = big_graph(nodes, Path(tmp) / "big.msgpack")
        print(f"\nwrote a chain of {nodes:,} named nodes in {time.perf_counter() - started:.1f} s")
        browser = playwright.chromium.launch(executable_path=chromium, args=ARGS)  # type: ignore[attr-defined]
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        started = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "graphsvc", "--disable-plugins", "view", str(file), "--no-browser"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            serving = time.perf_counter() - started
            url = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
            assert url, line
            page.goto(url.group(1))
            page.wait_for_selector("body[data-ready='1']", timeout=600_000)
            drawn = time.perf_counter() - started
            status = page.text_content("#status")
            print(f"process start to serving: {serving:.2f} s; to items drawn: {drawn:.2f} s ({status})")
            group = page.locator("svg .item.group.closed").first
            started = time.perf_counter()
            group.click()
            page.wait_for_selector("svg .item.group.open", timeout=600_000)
            page.evaluate("() => pending")
            opened = time.perf_counter() - started
            print(f"open one group, click to drawn: {opened:.2f} s ({page.text_content('#status')})")
        finally:
            browser.close()
            process.terminate()
            process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the Chromium to drive")
    parser.add_argument("--sizes", default="200,1000,3000", help="item counts to lay out, comma-separated")
    parser.add_argument("--dagre", type=Path, default=None, help="dagre's dist file, to compare")
    parser.add_argument("--nodes", type=int, default=1_000_000, help="nodes of the graph served (0: skip)")
    options = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        layouts(playwright, options.chromium, [int(n) for n in options.sizes.split(",")], options.dagre)
        if options.nodes:
            first_view(playwright, options.chromium, options.nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
