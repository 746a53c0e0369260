"""The suite imports its test modules by basename with tests/ on sys.path (pytest's prepend mode; the rigs are
imported as ``from conftest import ...``): two test files of one name in two folders stop the whole collection
("import file mismatch"), and a second conftest.py below tests/ takes the name ``conftest`` from the root one,
so every ``from conftest import ...`` after it fails. Both happened once, in a merge of branches that each ran
only their own folders."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_its_own_basename():
    where = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        where[path.name].append(str(path.relative_to(TESTS)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_the_root_conftest_is_the_only_one():
    assert [str(p.relative_to(TESTS)) for p in TESTS.rglob("conftest.py")] == ["conftest.py"]
