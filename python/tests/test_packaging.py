"""Packaging: mooncake is a PEP 420 namespace so other Mooncake distributions can share it."""

import subprocess
import sys

import pytest


def test_mooncake_is_a_namespace_package():
    import mooncake

    assert getattr(mooncake, "__file__", None) is None  # no mooncake/__init__.py
    assert hasattr(mooncake.__path__, "_path")  # a _NamespacePath


def test_coexists_with_another_mooncake_portion(tmp_path):
    other = tmp_path / "mooncake"
    other.mkdir()
    (other / "other_part.py").write_text("VALUE = 42\n")
    code = (
        "import sys; sys.path.append(%r)\n"
        "import mooncake.conductor, mooncake.other_part\n"
        "assert mooncake.other_part.VALUE == 42\n"
        "assert mooncake.conductor.OK == 0\n"
    ) % str(tmp_path)
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(sys.version_info < (3, 10), reason="needs sys.stdlib_module_names")
def test_runtime_uses_only_the_standard_library():
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import mooncake.conductor\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "std = set(sys.stdlib_module_names) | {'mooncake'}\n"
        "extra = sorted(m for m in new if m not in std and not m.startswith('_'))\n"
        "assert not extra, extra\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
