"""`python -m helpers.course.site --run <run folder> --out <folder>`: the course as a static website, built offline.

From one run folder of `helpers.course.run` (executed notebooks, records, summary) it writes Sphinx sources into
<out>/src (`helpers.course.site_pages`: a page per notebook, the claims ledger, your device against the reference,
the index) and builds them with myst-nb into <out>/html. Nothing is fetched: the notebooks are rendered as executed
(`nb_execution_mode = "off"`), the theme is alabaster, which ships with Sphinx, math stays as text (no MathJax from a
CDN), and no widget script is loaded. `make site` runs the course in smoke first, or takes `RUN=runs/<folder>`.

Exit status: 0 built, 1 Sphinx failed, 2 a usage error (a missing run folder, a folder that is not a run).
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from helpers.course import site_pages
from helpers.course.processes import OneLineParser
from helpers.measure import clock
from helpers.measure.results import REPO_ROOT

# The Sphinx configuration written to <out>/src/conf.py. Every setting that could reach the network is set here:
# no MathJax (math renders as its own text), no ipywidgets scripts, no theme links outside the site.
CONF = '''"""Sphinx configuration of the course's website, written by helpers.course.site (edit it there)."""
from docutils import nodes

project = {project!r}
extensions = ["myst_nb"]
nb_execution_mode = "off"          # the run executed the notebooks; the site shows them as they are
nb_ipywidgets_js = {{}}             # widget scripts come from a CDN: none
myst_enable_extensions = ["dollarmath", "amsmath"]
html_theme = "alabaster"
html_theme_options = {{"show_powered_by": False, "github_button": False, "github_banner": False,
                      "show_relbars": True, "page_width": "1180px", "body_max_width": "none",
                      "sidebar_width": "250px"}}
html_title = project
html_static_path = ["_static"]
html_css_files = ["site.css"]
html_show_sphinx = False
html_show_copyright = False
html_show_sourcelink = False
html_copy_source = False
html_math_renderer = "text"
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "myst.xref_missing", "misc.highlighting_failure"]


def _inline(self, node):
    self.body.append(self.starttag(node, "span", "", CLASS="math") + self.encode(node.astext()) + "</span>")
    raise nodes.SkipNode


def _block(self, node):
    self.body.append(self.starttag(node, "div", CLASS="math") + self.encode(node.astext()) + "</div>")
    raise nodes.SkipNode


def setup(app):
    # math as its own text, in a monospace span: MathJax would be a script fetched from a CDN
    app.add_html_math_renderer("text", (_inline, None), (_block, None))
'''

SITE_CSS = """div.math,span.math{font-family:monospace;white-space:pre-wrap}
div.cell_output img{max-width:100%}
"""


class SiteError(Exception):
    """Why the site cannot be built from what was given (one line, exit status 2)."""


def check_run(run_dir: Path) -> Path:
    """The run folder, resolved; SiteError when it is missing or is not a run folder of helpers.course.run."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise SiteError(f"no run folder {run_dir} (make one with `python -m helpers.course.run --profile smoke`, "
                        "or give an existing runs/<folder>)")
    if not run_dir.is_dir():
        raise SiteError(f"{run_dir} is a file, not a run folder")
    if not ((run_dir / "notebooks").is_dir() or (run_dir / "results").is_dir()):
        raise SiteError(f"{run_dir} is not a run folder: it has neither notebooks/ nor results/ "
                        "(helpers.course.run writes both)")
    return run_dir.resolve()


def write_conf(src: Path) -> None:
    """conf.py and the site's stylesheet (the report's table and verdict colours) into the source folder `src`."""
    (src / "conf.py").write_text(CONF.format(project=site_pages.COURSE_TITLE))
    (src / "_static").mkdir(parents=True, exist_ok=True)
    (src / "_static" / "site.css").write_text(SITE_CSS + site_pages.table_css() + "\n")


def build(run_dir: Path, out: Path, references: Path = REPO_ROOT / "results",
          notebooks_dir: Path = REPO_ROOT / "notebooks", say=print) -> Path:
    """Build the site of `run_dir` into `out` (sources in out/src, pages in out/html); return the index page.

    Raises SiteError for a bad run folder or an empty notebooks folder, RuntimeError when Sphinx fails (its
    messages are in out/sphinx.log).
    """
    run_dir = check_run(run_dir)
    if not sorted(Path(notebooks_dir).glob("[0-9][0-9]_*.ipynb")):
        raise SiteError(f"no course notebooks (NN_*.ipynb) in {notebooks_dir}")
    out = Path(out).resolve()
    src, html, log = out / "src", out / "html", out / "sphinx.log"
    if run_dir == out or out in run_dir.parents:
        raise SiteError(f"--out {out} holds the run folder; give a folder of its own")
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    say(f"site of {run_dir} -> {html}")
    with clock.Stopwatch(tally=False) as took:  # its wall seconds: what the person waiting for the build sees
        pages = site_pages.write_sources(run_dir, src, Path(references), Path(notebooks_dir), say=say)
        write_conf(src)
        from sphinx.cmd.build import build_main  # heavy: only a build needs Sphinx

        shutil.rmtree(html, ignore_errors=True)
        code = build_main(["-b", "html", "-q", "-E", "-w", str(log), "-d", str(out / "doctrees"), str(src), str(html)])
    if code != 0:
        raise RuntimeError(f"Sphinx failed (exit {code}); its messages are in {log}")
    say(f"built {len(pages)} pages in {took.wall:.1f} s: {html / 'index.html'}\n"
        f"open it: python -m http.server -d {html}  (then http://localhost:8000), or file://{html / 'index.html'}")
    return html / "index.html"


def latest_run(runs: Path) -> Path:
    """The newest run folder under `runs` (by name: runs are named by their start time); SiteError when none."""
    folders = sorted(d for d in Path(runs).glob("[0-9]*-*") if d.is_dir() and (d / "notebooks").is_dir())
    if not folders:
        raise SiteError(f"no run folder under {runs}")
    return folders[-1]


def build_parser() -> OneLineParser:
    """The command line of the site builder."""
    p = OneLineParser(prog="python -m helpers.course.site",
                      description="Build the course as a static website (Sphinx + myst-nb, no network) from a run.")
    p.add_argument("--run", type=Path, default=None,
                   help="the run folder (runs/<timestamp>-<device>); default: the newest under --runs")
    p.add_argument("--runs", type=Path, default=REPO_ROOT / "runs", help="where to look for the newest run (default: runs/)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "site",
                   help="where the sources (src/) and the pages (html/) go (default: runs/site, git-ignored)")
    p.add_argument("--references", type=Path, default=REPO_ROOT / "results",
                   help="folder of reference results, one sub-folder per GPU (default: results/)")
    p.add_argument("--notebooks-dir", type=Path, default=REPO_ROOT / "notebooks",
                   help="the committed notebooks, for the pages of notebooks the run did not execute")
    return p


def main(argv: list[str] | None = None) -> int:
    """Build the site; see the module docstring for the exit status."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run_dir = args.run if args.run is not None else latest_run(args.runs)
        build(run_dir, args.out, args.references, args.notebooks_dir)
    except SiteError as err:
        print(f"helpers.course.site: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        print(f"helpers.course.site: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
