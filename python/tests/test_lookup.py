"""Where the package finds libompk: OMPK_LIBRARY, next to the package, the loader, pkg-config."""
import ctypes.util
import os
import shutil
import subprocess
import sys

import pytest

import ompk

PKG = os.path.dirname(ompk.__file__)
LIB = os.path.realpath(ompk.library_path)


def _import(tmp_path, env_extra, pkg_dir=None):
    env = {k: v for k, v in os.environ.items() if k not in ("OMPK_LIBRARY", "PKG_CONFIG_PATH")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(pkg_dir or os.path.dirname(PKG))
    return subprocess.run([sys.executable, "-c", "import ompk; print(ompk.library_path)"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)


def _bare_package(tmp_path):
    dst = tmp_path / "site" / "ompk"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("libompk.so*", "__pycache__"))
    return dst


def test_missing_library_says_what_to_do(tmp_path):
    r = _import(tmp_path, {"OMPK_LIBRARY": str(tmp_path / "nowhere.so")})
    assert r.returncode != 0 and "set OMPK_LIBRARY" in r.stderr and "nowhere.so" in r.stderr


def test_library_next_to_package(tmp_path):
    dst = _bare_package(tmp_path)
    shutil.copy(LIB, dst / "libompk.so.0")
    r = _import(tmp_path, {}, dst.parent)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(dst / "libompk.so.0")


def test_library_from_pkg_config(tmp_path):
    if shutil.which("pkg-config") is None:
        pytest.skip("no pkg-config")
    if ctypes.util.find_library("ompk"):
        pytest.skip("the loader finds a libompk here, which comes before pkg-config")
    dst = _bare_package(tmp_path)
    libdir = tmp_path / "prefix" / "lib"
    libdir.mkdir(parents=True)
    shutil.copy(LIB, libdir / "libompk.so")
    (tmp_path / "ompk.pc").write_text(
        f"libdir={libdir}\nName: ompk\nDescription: t\nVersion: 0.1.0\nLibs: -L{libdir} -lompk\n")
    r = _import(tmp_path, {"PKG_CONFIG_PATH": str(tmp_path)}, dst.parent)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(libdir / "libompk.so")
