"""A tiny course-style notebook for the runner's and the capture's tests: a parameters cell with the four
common parameters, then one code cell."""
import nbformat


def tiny_notebook(path, body: str) -> None:
    """Write a notebook at `path`: a title, the tagged parameters cell, then `body` as its one code cell."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('PROFILE = "auto"\nSEED = 0\nINTERACTIVE = True\nRESULTS_DIR = None')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# tiny"), params, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
