"""Screenshots of ``depthlens view``'s pages (docs/view.md), taken by Debian's chromium through Playwright.

    depthlens view runs/demo/chain_sum --port 8765 &
    python examples/view_screenshots.py http://127.0.0.1:8765/ docs/figures/view --question chain_sum-1 \
        --response 'chain_sum-1#3' --token 12

Each view is one PNG: ``<prefix>-run.png`` (the run, its voting table, the questions), ``-question.png`` (a
question's pool, a draw, every response's scores), ``-response.png`` (the tokens coloured by settling depth, one
token's layers, the heatmap); ``--records`` instead shoots a score store's records and one record; ``--lens``
(a store written with ``--layer-top-k``) also ``-lens.png``: the response's logit lens, with the top-k of the cell
at ``--token`` and ``--layer``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import quote

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url")
    parser.add_argument("prefix", type=Path, help="PNG path prefix, e.g. docs/figures/view")
    parser.add_argument("--question", default=None)
    parser.add_argument("--response", default=None)
    parser.add_argument("--token", type=int, default=0)
    parser.add_argument("--query", default="", help="voting settings, e.g. 'n=4&eta=0.5&prefix=20'")
    parser.add_argument("--records", action="store_true", help="a score store: its records, then --response")
    parser.add_argument("--lens", action="store_true", help="also the logit lens (a --layer-top-k store)")
    parser.add_argument(
        "--layer", type=int, default=None, help="with --lens: the cell's layer (default: middle)"
    )
    parser.add_argument("--width", type=int, default=1440)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    query = f"?{args.query}" if args.query else ""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
        page = browser.new_page(viewport={"width": args.width, "height": 900}, device_scale_factor=1)
        shots = []
        if args.records:
            page.goto(f"{args.url}#/records{query}")
            page.wait_for_selector("#records tbody tr")
            shots.append(("records", True))
        else:
            page.goto(f"{args.url}#/{query}")
            page.wait_for_selector("#voting.ready tbody tr")
            page.wait_for_selector(
                "#questions td.mark .right, #questions td.mark .wrong, #questions td.mark .mixed"
            )
            shots.append(("run", True))
        page.screenshot(path=f"{args.prefix}-{shots[-1][0]}.png", full_page=True)
        if args.question:
            page.goto(f"{args.url}#/q/{quote(args.question, safe='')}{query}")
            page.wait_for_selector("#responses tbody tr")
            page.screenshot(path=f"{args.prefix}-question.png", full_page=True)
        if args.response:
            page.goto(f"{args.url}#/r/{quote(args.response, safe='')}{query}")
            page.wait_for_selector("#tokens .tok")
            page.click(f'#tokens .tok[data-i="{args.token}"]')
            if page.is_enabled("#show-heatmap"):  # a TCB trace has no layers to draw
                page.click("#show-heatmap")
                page.wait_for_selector("#heatmap")
            page.screenshot(
                path=f"{args.prefix}-{'record' if args.records else 'response'}.png", full_page=True
            )
        if args.response and args.lens:
            page.goto(f"{args.url}#/r/{quote(args.response, safe='')}?view=lens")
            page.wait_for_selector("#logit-lens tbody tr")
            layer = (
                args.layer or int(page.eval_on_selector("#logit-lens tbody tr", "r => r.dataset.layer")) // 2
            )
            page.click(f'#logit-lens td[data-t="{args.token}"][data-layer="{layer}"]')
            page.wait_for_selector("#layer-top tbody tr")
            page.screenshot(path=f"{args.prefix}-lens.png", full_page=True)
        browser.close()


if __name__ == "__main__":
    main()
