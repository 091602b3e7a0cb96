"""The TensorRT wheels' library folders are found one way (irpe.runtime.tensorrt.common.library_dir
/ wheel_library_dirs), used by the plugin build (tools/trt_plugin_build) and the isolated engine
build (irpe.runtime.tensorrt.isolate). Real package folders on sys.path stand in for the wheels."""
import sys
from pathlib import Path

import pytest

import irpe.runtime.tensorrt.isolate as isolate
from irpe.runtime.tensorrt import common as trt_common
from irpe.runtime.tensorrt.common import WHEEL_LIBS, library_dir, wheel_library_dirs
from tools import trt_plugin_build


def _wheel(root: Path, package: str, *libs: str) -> Path:
    folder = root / package
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    for lib in libs:
        (folder / lib).write_bytes(b"\x7fELF")
    return folder


def _prepend(monkeypatch, folder: Path) -> None:
    """``folder`` first on sys.path; imported wheel packages forgotten (find_spec would answer
    from sys.modules) until the test ends."""
    for name in WHEEL_LIBS:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(folder))


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """tensorrt_rtx_libs with libtensorrt_rtx.so.1, tensorrt_libs with libnvinfer.so.10, found
    before any installed wheel of the same name."""
    rtx = _wheel(tmp_path, "tensorrt_rtx_libs", "libtensorrt_rtx.so.1",
                 "libtensorrt_onnxparser_rtx.so.1")
    full = _wheel(tmp_path, "tensorrt_libs", "libnvinfer.so.10")
    _prepend(monkeypatch, tmp_path)
    monkeypatch.delenv("TENSORRT_ROOT", raising=False)
    return rtx, full


def test_wheel_folders_found_in_order(wheels):
    rtx, full = wheels
    assert WHEEL_LIBS == ("tensorrt_rtx_libs", "tensorrt_libs")
    assert wheel_library_dirs() == [rtx, full]
    assert wheel_library_dirs(("tensorrt_libs",)) == [full]
    assert wheel_library_dirs(("no_such_irpe_wheel_libs",)) == []


def test_library_dir_matches_pattern_then_extra_folders(wheels, tmp_path):
    rtx, full = wheels
    assert library_dir("libtensorrt_rtx.so.1") == rtx
    assert library_dir("libnvinfer.so*") == full
    other = tmp_path / "system"
    other.mkdir()
    (other / "libnvinfer.so.11").write_bytes(b"")
    assert library_dir("libnvinfer.so.11", extra=[other]) == other
    absent = [tmp_path / "absent"]
    assert library_dir("libnvinfer.so*", ("no_such_irpe_wheel_libs",), absent) is None


def test_users_share_the_lookup(wheels, tmp_path, monkeypatch):
    """trt_plugin_build's runtime folders and isolate's link folders come from common."""
    rtx, full = wheels
    assert isolate.wheel_library_dirs is trt_common.wheel_library_dirs
    assert isolate.wheel_library_dirs() == [rtx, full]
    assert trt_plugin_build.rtx_library_dir() == rtx
    assert trt_plugin_build.tensorrt_library_dir() == full
    links = tmp_path / "links"
    links.mkdir()
    made = isolate.link_unversioned(links, isolate.wheel_library_dirs())
    assert made == ["libtensorrt_onnxparser_rtx.so", "libtensorrt_rtx.so", "libnvinfer.so"]
    assert (links / "libtensorrt_rtx.so").resolve() == rtx / "libtensorrt_rtx.so.1"


def test_tensorrt_root_is_searched_after_the_wheel(tmp_path, monkeypatch):
    """No tensorrt_libs wheel folder with libnvinfer: $TENSORRT_ROOT/lib is used."""
    _wheel(tmp_path / "site", "tensorrt_libs")  # a wheel folder without the library
    root = tmp_path / "trt"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "libnvinfer.so.10").write_bytes(b"")
    _prepend(monkeypatch, tmp_path / "site")
    monkeypatch.setenv("TENSORRT_ROOT", str(root))
    assert trt_plugin_build.tensorrt_library_dir() == root / "lib"
