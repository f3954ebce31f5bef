"""The PEP 517 / PEP 660 build backend of the `stowage` Python package.

Why a backend of our own: the package is pure Python over a C library loaded with ctypes, so
building it is copying files into a zip. With setuptools as the backend, `pip install
python` first downloads setuptools into an isolated build environment, which fails on a
machine without network access (a cluster node, the GPU machines). This backend needs nothing
beyond the standard library, so pip's isolated build has nothing to fetch.

What it builds:
  * a wheel of the `stowage` package. When a built libstowage.so can be found it is copied into
    the package directory (the first place `stowage._lib` looks at run time) and the wheel is
    tagged for this platform; otherwise the wheel is pure and the library is found at run time
    (see stowage/_lib.py). Where the library comes from, first match wins:
      1. `--config-settings stowage-library=PATH` (pip) / `-C stowage-library=PATH` (build);
      2. the STOWAGE_LIBRARY environment variable;
      3. pkg-config's `libdir` of the `stowage` module (what `cmake --install` writes);
    `stowage-library=none` builds the pure wheel even when a library is installed.
  * an editable wheel (PEP 660): a .pth file putting this source directory on sys.path;
  * an sdist of this directory.

Metadata comes from pyproject.toml's [project] table (the one place the version is written
beside CMake's project(VERSION); configuring CMake checks the two agree).
"""

from __future__ import annotations

import base64
import glob
import hashlib
import io
import os
import re
import subprocess
import sysconfig
import tarfile
import time
import zipfile
from typing import Optional

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = "stowage"
_LIBRARY_SETTING = "stowage-library"


def _read_project() -> dict:
    path = os.path.join(_ROOT, "pyproject.toml")
    with open(path, "rb") as f:
        data = f.read()
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        return _read_project_fallback(data.decode("utf-8"), path)
    return tomllib.loads(data.decode("utf-8"))["project"]


def _read_project_fallback(text: str, path: str) -> dict:
    """Python < 3.11 has no TOML reader in the standard library. pyproject.toml's [project] table
    uses only `key = "string"`, `key = []`/`["a", ...]` and one `[project.optional-dependencies]`
    table of such lists, which this reads; anything else is an error naming the line."""
    project: dict = {}
    table = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        header = re.fullmatch(r"\[([^\]]+)\]", line)
        if header:
            table = header.group(1)
            continue
        if table not in ("project", "project.optional-dependencies"):
            continue
        m = re.fullmatch(r'([A-Za-z0-9_-]+)\s*=\s*(".*"|\[.*\])', line)
        if not m:
            raise ValueError(f"{path}:{number}: cannot read {raw!r} without tomllib (Python 3.11+)")
        key, value = m.group(1), m.group(2)
        parsed = re.findall(r'"((?:[^"\\]|\\.)*)"', value) if value.startswith("[") else value[1:-1]
        if table == "project":
            project[key] = parsed
        else:
            project.setdefault("optional-dependencies", {})[key] = parsed
    return project


def _dist_name(project: dict) -> str:
    return re.sub(r"[-_.]+", "_", project["name"]).lower()


def _metadata(project: dict) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
    ]
    if "description" in project:
        lines.append(f"Summary: {project['description']}")
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    for requirement in project.get("dependencies", []):
        lines.append(f"Requires-Dist: {requirement}")
    for extra, requirements in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for requirement in requirements:
            lines.append(f'Requires-Dist: {requirement}; extra == "{extra}"')
    readme = project.get("readme")
    body = ""
    if isinstance(readme, str):
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(_ROOT, readme), encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _package_files() -> list[tuple[str, str]]:
    """(path in the wheel, source path) of every file of the package, sorted. Build leftovers
    (bytecode, a library copied in by hand) are not part of it."""
    out = []
    base = os.path.join(_ROOT, _PACKAGE)
    for directory, subdirs, files in os.walk(base):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")) or name.startswith("libstowage.so"):
                continue
            source = os.path.join(directory, name)
            out.append((os.path.relpath(source, _ROOT).replace(os.sep, "/"), source))
    return out


def _find_library(config_settings: Optional[dict]) -> Optional[str]:
    setting = (config_settings or {}).get(_LIBRARY_SETTING)
    if setting == "none":
        return None
    if setting:
        if not os.path.isfile(setting):
            raise FileNotFoundError(
                f"config setting {_LIBRARY_SETTING}={setting!r} is not a file; pass the path of "
                "a built libstowage.so, or 'none' for a wheel without it")
        return setting
    env = os.environ.get("STOWAGE_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"STOWAGE_LIBRARY is {env!r}, which is not a file")
        return env
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "stowage"], check=True,
                                capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None  # no pkg-config, or stowage not installed: a pure wheel
    candidates = sorted(glob.glob(os.path.join(libdir, "libstowage.so*")))
    return candidates[0] if candidates else None


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory: str, files: list[tuple[str, bytes]], project: dict,
                 tag: str) -> str:
    dist = _dist_name(project)
    version = project["version"]
    info = f"{dist}-{version}.dist-info"
    wheel_meta = ("Wheel-Version: 1.0\nGenerator: stowage_build\n"
                  f"Root-Is-Purelib: {'true' if tag.endswith('-any') else 'false'}\n"
                  f"Tag: {tag}\n")
    files = files + [
        (f"{info}/METADATA", _metadata(project).encode()),
        (f"{info}/WHEEL", wheel_meta.encode()),
        (f"{info}/top_level.txt", f"{_PACKAGE}\n".encode()),
    ]
    record = [_record_line(name, data) for name, data in files] + [f"{info}/RECORD,,"]
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    filename = f"{dist}-{version}-{tag}.whl"
    # A fixed timestamp makes two builds of the same tree byte-identical.
    stamp = time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")))[:6]
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w",
                         zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files:
            entry = zipfile.ZipInfo(name, date_time=stamp)
            entry.external_attr = (0o755 if name.endswith(".so") or ".so." in name
                                   else 0o644) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(entry, data)
    return filename


def _platform_tag() -> str:
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


# --- PEP 517 hooks ------------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    project = _read_project()
    info = f"{_dist_name(project)}-{project['version']}.dist-info"
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata(project))
    return info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    project = _read_project()
    files = []
    for name, source in _package_files():
        with open(source, "rb") as f:
            files.append((name, f.read()))
    library = _find_library(config_settings)
    tag = "py3-none-any"
    if library:
        # The real file under its own name (libstowage.so.MAJOR.MINOR.PATCH when given the
        # installed symlink), so the copy says which build it is.
        real = os.path.realpath(library)
        with open(real, "rb") as f:
            files.append((f"{_PACKAGE}/{os.path.basename(real)}", f.read()))
        tag = f"py3-none-{_platform_tag()}"
    return _write_wheel(wheel_directory, files, project, tag)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    project = _read_project()
    pth = (os.path.abspath(_ROOT) + "\n").encode()
    return _write_wheel(wheel_directory, [(f"__editable__.{_dist_name(project)}.pth", pth)],
                        project, "py3-none-any")


def build_sdist(sdist_directory, config_settings=None):
    project = _read_project()
    base = f"{_dist_name(project)}-{project['version']}"
    members = ["pyproject.toml", "README.md"] + [name for name, _ in _package_files()]
    for directory, subdirs, names in os.walk(os.path.join(_ROOT, "build_backend")):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        members += [os.path.relpath(os.path.join(directory, n), _ROOT) for n in sorted(names)
                    if n.endswith(".py")]
    filename = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as sdist:
        for member in members:
            sdist.add(os.path.join(_ROOT, member), arcname=f"{base}/{member}")
        pkg_info = _metadata(project).encode()
        entry = tarfile.TarInfo(f"{base}/PKG-INFO")
        entry.size = len(pkg_info)
        sdist.addfile(entry, io.BytesIO(pkg_info))
    return filename
