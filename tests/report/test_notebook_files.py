"""The notebooks as committed: valid nbformat 4.5 (every cell with its id,
which nbformat will require), no outputs.  Running them is
test_notebooks.py's (root: they read real captures)."""
from __future__ import annotations

import warnings

import nbformat
import pytest
from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"seek_cdf.ipynb", "walkthrough.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_valid_with_cell_ids_and_no_outputs(path):
    with warnings.catch_warnings():
        # (a cell without an id is a MissingIDFieldWarning today, an error later)
        warnings.simplefilter("error")
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    assert (nb.nbformat, nb.nbformat_minor) >= (4, 5), path.name
    missing = [i for i, c in enumerate(nb.cells) if not c.get("id")]
    assert not missing, f"{path.name}: cells without an id: {missing}"
    ids = [c.id for c in nb.cells]
    assert len(set(ids)) == len(ids), f"{path.name}: cell ids repeated"
    with_outputs = [i for i, c in enumerate(nb.cells)
                    if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not with_outputs, f"{path.name} is committed with outputs in cells {with_outputs}"
