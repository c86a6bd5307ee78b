"""``kiln doctor``: what Kiln finds on this machine (platform, libkiln, the GPU and driver, the
CUDA runtime, cuBLASLt and cuDNN with their paths and versions, ExecuTorch and whether
KilnBackend is registered) and which device ``auto`` picks and why; ``--install-hint``: the pip
line for this machine.

Everything is probed in this process through ctypes (libcuda's driver API, the libraries the CUDA
plugin loaded, read back from /proc/self/maps): no torch import, so it runs where only libkiln is
installed."""

from __future__ import annotations

import ctypes
import platform
import sys
from importlib import metadata
from pathlib import Path

from .. import _lib
from . import _capi
from ._out import text

# The CUDA major version the CUDA plugin is built for, and the driver that supports it.
CUDA_MAJOR = 13
MIN_DRIVER = "580"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _mapped(*names: str) -> dict[str, str]:
    """soname prefix -> path of the first mapped file whose name starts with it."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        base = path.rsplit("/", 1)[-1]
        for n in names:
            if n not in out and base.startswith(n):
                out[n] = path
    return out


def _driver() -> dict:
    """The NVIDIA driver and GPUs, through libcuda's driver API."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return {"found": False, "why": f"no NVIDIA driver: libcuda.so.1 cannot be loaded ({e})"}
    d: dict = {"found": True, "library": _mapped("libcuda.so").get("libcuda.so")}
    rc = cu.cuInit(0)
    v = ctypes.c_int()
    if cu.cuDriverGetVersion(ctypes.byref(v)) == 0:
        d["cuda_version"] = f"{v.value // 1000}.{(v.value % 1000) // 10}"
        d["cuda_version_int"] = v.value
    if rc != 0:
        d["why"] = f"cuInit failed with CUDA error {rc} (no usable GPU, or the driver is broken)"
        d["gpus"] = []
        return d
    n = ctypes.c_int()
    cu.cuDeviceGetCount(ctypes.byref(n))
    gpus = []
    for i in range(n.value):
        dev = ctypes.c_int()
        if cu.cuDeviceGet(ctypes.byref(dev), i) != 0:
            continue
        name = ctypes.create_string_buffer(256)
        cu.cuDeviceGetName(name, 256, dev)
        major, minor = ctypes.c_int(), ctypes.c_int()
        cu.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)
        cu.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
        mem = ctypes.c_size_t()
        cu.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
        gpus.append(
            {
                "index": i,
                "name": name.value.decode("utf-8", "replace"),
                "compute_capability": f"{major.value}.{minor.value}",
                "memory_bytes": mem.value,
            }
        )
    d["gpus"] = gpus
    if not gpus:
        d["why"] = "the driver reports no GPU"
    return d


def _call_version(path: str | None, fn: str) -> int | None:
    if not path:
        return None
    try:
        lib = ctypes.CDLL(path)
        f = getattr(lib, fn)
    except (OSError, AttributeError):
        return None
    if fn in ("cublasLtGetVersion", "cudnnGetVersion"):
        f.restype = ctypes.c_size_t
        return int(f())
    v = ctypes.c_int()
    return v.value if f(ctypes.byref(v)) == 0 else None


def _cudnn(plugin: str | None) -> dict:
    got = _mapped("libcudnn.so").get("libcudnn.so")
    how = "loaded by the CUDA plugin"
    if not got:
        cands = []
        if plugin:
            sp = Path(plugin).resolve().parent.parent.parent
            cands.append(sp / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9")
        cands.append("libcudnn.so.9")
        for c in cands:
            try:
                ctypes.CDLL(str(c))
            except OSError:
                continue
            got = _mapped("libcudnn.so").get("libcudnn.so")
            how = "found where the plugin looks (it loads it at the first layer that uses it)"
            break
    if not got:
        return {
            "found": False,
            "why": "libcudnn.so.9 not found: convolutions and attention use Kiln's own kernels "
            "(pip install nvidia-cudnn-cu13 to use cuDNN)",
        }
    v = _call_version(got, "cudnnGetVersion")
    return {"found": True, "path": got, "version": _fmt_cudnn(v), "how": how}


def _fmt_cudnn(v: int | None) -> str | None:
    if not v:
        return None
    return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"


def _fmt_cuda(v: int | None) -> str | None:
    return None if not v else f"{v // 1000}.{(v % 1000) // 10}"


def _device_choice() -> dict:
    """Loads a one-layer engine with device "auto" and reports where it runs, with libkiln's own
    log lines saying why, and checks one execute against the expected values."""
    out: dict = {}
    with _capi.LogCapture(level=1) as logs:
        try:
            eng_bytes = _capi.tiny_engine()
            eng = _capi.Engine(eng_bytes, {}, {"device": "auto"}, seed=1)
            out["device"] = eng.device
            eng.execute()
            out["execute_ok"] = _capi.check_tiny(eng)
            eng.close()
        except Exception as e:  # noqa: BLE001 - reported
            out["device"] = None
            out["error"] = f"{type(e).__name__}: {e}"
    out["log"] = [m for _lvl, m in logs.lines]
    cuda_lines = [m for m in out["log"] if "CUDA" in m or "cuda" in m]
    if out.get("device", "") and out["device"].startswith("cuda"):
        out["why"] = "the CUDA plugin loaded and found a device" + (
            f" ({cuda_lines[-1]})" if cuda_lines else ""
        )
    elif out.get("device") == "cpu":
        out["why"] = (
            cuda_lines[-1]
            if cuda_lines
            else "the CUDA backend is not available (no libkiln_cuda.so beside libkiln, or no GPU)"
        )
    return out


def _executorch() -> dict:
    et = _version("executorch")
    rt = _version("kiln-executorch-runtime")
    d: dict = {"executorch": et, "kiln_executorch_runtime": rt, "registered": False}
    if rt is None:
        d["why"] = (
            "kiln-executorch-runtime is not installed: ExecuTorch cannot run Kiln programs here "
            '(pip install "kiln[executorch]"); the C API path (kiln bench --engines, kiln '
            "profile) works without it"
        )
        return d
    try:
        import kiln_executorch_runtime as krt

        krt.register()
        d["delegate_library"] = str(krt.library_path())
        d["built_against"] = krt._pins.EXECUTORCH_VERSION
    except Exception as e:  # noqa: BLE001 - reported
        d["why"] = f"{type(e).__name__}: {e}"
        return d
    try:
        from executorch.runtime import Runtime

        reg = Runtime.get().backend_registry
        d["registered"] = bool(reg.is_available("KilnBackend"))
        d["backends"] = list(getattr(reg, "registered_backend_names", []))
    except Exception as e:  # noqa: BLE001 - reported
        d["why"] = f"ExecuTorch's runtime cannot be queried: {type(e).__name__}: {e}"
    return d


def collect() -> dict:
    rep: dict = {
        "platform": {
            "system": platform.system(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "libc": " ".join(platform.libc_ver()),
        },
        "kiln": {"version": _version("kiln"), "torch": _version("torch")},
        "problems": [],
    }
    try:
        lib = _lib.library()
        rep["kiln"]["library"] = str(_lib.library_path())
        rep["kiln"]["library_version"] = lib.kiln_version_string().decode()
    except Exception as e:  # noqa: BLE001 - reported
        rep["kiln"]["error"] = f"{type(e).__name__}: {e}"
        rep["problems"].append(f"libkiln cannot be loaded: {e}")
        rep["ok"] = False
        return rep
    rep["driver"] = _driver()
    rep["device_auto"] = _device_choice()
    if rep["device_auto"].get("error"):
        rep["problems"].append(f"a one-layer engine fails: {rep['device_auto']['error']}")
    elif not rep["device_auto"].get("execute_ok"):
        rep["problems"].append("a one-layer engine ran but gave wrong values")
    libs = _mapped("libkiln_cuda.so", "libcudart.so", "libcublasLt.so", "libcublas.so")
    plugin = libs.get("libkiln_cuda.so")
    cuda: dict = {"plugin": plugin}
    if plugin:
        cuda["cudart"] = {
            "path": libs.get("libcudart.so"),
            "version": _fmt_cuda(_call_version(libs.get("libcudart.so"), "cudaRuntimeGetVersion")),
        }
        lt = _call_version(libs.get("libcublasLt.so"), "cublasLtGetVersion")
        cuda["cublaslt"] = {
            "path": libs.get("libcublasLt.so"),
            "version": None if not lt else f"{lt // 10000}.{(lt % 10000) // 100}.{lt % 100}",
        }
        cuda["cudnn"] = _cudnn(plugin)
    else:
        cuda["why"] = "the CUDA plugin (libkiln_cuda.so) was not loaded: " + (
            rep["device_auto"].get("why") or "see device_auto"
        )
    rep["cuda"] = cuda
    rep["executorch"] = _executorch()
    ex = rep["executorch"]
    if ex["kiln_executorch_runtime"] is not None and not ex["registered"]:
        rep["problems"].append(f"KilnBackend is not registered with ExecuTorch: {ex.get('why')}")
    rep["ok"] = not rep["problems"]
    return rep


def install_hint(rep: dict) -> dict:
    """The pip line for this machine: its platform, Python and the CUDA its driver supports."""
    p = rep["platform"]
    notes = []
    if p["system"] != "Linux" or p["machine"] not in ("x86_64", "AMD64"):
        return {
            "command": None,
            "notes": [
                f"Kiln's wheels are for Linux x86-64; this is {p['system']} {p['machine']}: build "
                "from a checkout (make install; docs/packaging.md)"
            ],
        }
    py = tuple(int(x) for x in p["python"].split(".")[:2])
    if not (3, 10) <= py < (3, 15):
        return {
            "command": None,
            "notes": [f"Python {p['python']}: Kiln needs Python 3.10-3.14"],
        }
    drv = rep.get("driver") or {}
    cmd = 'pip install "kiln[executorch]"'
    if not drv.get("found"):
        notes.append(
            "no NVIDIA driver: Kiln's engines run on its CPU reference backend; with a GPU and "
            f'driver >= {MIN_DRIVER}, pip install "kiln[executorch,cuda]"'
        )
    elif drv.get("cuda_version_int", 0) < CUDA_MAJOR * 1000:
        notes.append(
            f"the driver supports CUDA {drv.get('cuda_version')}; Kiln's GPU backend needs CUDA "
            f"{CUDA_MAJOR} (driver >= {MIN_DRIVER}): update the driver, then "
            'pip install "kiln[executorch,cuda]". Until then the engines run on the CPU'
        )
    else:
        cmd = 'pip install "kiln[executorch,cuda]"'
        notes.append(
            f"driver with CUDA {drv.get('cuda_version')}: the cuda extra brings the CUDA "
            f"{CUDA_MAJOR} runtime, cuBLAS and cuDNN wheels (nvidia-cuda-runtime, nvidia-cublas, "
            "nvidia-cudnn-cu13) that libkiln_cuda.so loads"
        )
    return {"command": cmd, "notes": notes, "python": sys.executable}


def print_report(rep: dict) -> None:
    p, k = rep["platform"], rep["kiln"]
    print(f"platform: {p['system']} {p['machine']}, Python {p['python']}, {p['libc']}")
    print(
        f"kiln {k.get('version') or '(not installed as a distribution)'}; "
        f"torch {k.get('torch') or 'not installed'}"
    )
    if "error" in k:
        print(f"libkiln: {text(k['error'])}")
    else:
        print(f"libkiln {k['library_version']}: {text(k['library'])}")
    drv = rep.get("driver")
    if drv is not None:
        if not drv["found"]:
            print(f"GPU: none ({text(drv['why'])})")
        else:
            print(
                f"driver: CUDA {drv.get('cuda_version')} "
                f"({text(drv.get('library') or 'libcuda.so.1')})"
            )
            for g in drv.get("gpus", []):
                print(
                    f"  GPU {g['index']}: {text(g['name'])}, compute capability "
                    f"{g['compute_capability']}, {g['memory_bytes'] / (1 << 30):.1f} GiB"
                )
            if drv.get("why"):
                print(f"  {text(drv['why'])}")
    cuda = rep.get("cuda")
    if cuda is not None:
        if cuda.get("plugin"):
            print(f"CUDA plugin: {text(cuda['plugin'])}")
            for name in ("cudart", "cublaslt", "cudnn"):
                c = cuda.get(name) or {}
                if c.get("path"):
                    print(f"  {name}: {c.get('version') or '?'} ({text(c['path'])})")
                else:
                    print(f"  {name}: not found ({text(c.get('why', ''))})")
        else:
            print(f"CUDA: {text(cuda.get('why', 'not loaded'))}")
    da = rep.get("device_auto")
    if da is not None:
        state = "runs" if da.get("execute_ok") else "FAILS"
        print(
            f"device auto -> {da.get('device')}: "
            f"{text(da.get('why') or da.get('error') or '')} (a one-layer engine {state})"
        )
    ex = rep.get("executorch")
    if ex is not None:
        print(
            f"executorch {ex['executorch'] or 'not installed'}; kiln-executorch-runtime "
            f"{ex['kiln_executorch_runtime'] or 'not installed'}; KilnBackend "
            f"{'registered' if ex['registered'] else 'not registered'}"
            + (f" ({text(ex['why'])})" if ex.get("why") else "")
        )
    for prob in rep["problems"]:
        print(f"problem: {text(prob)}")
    print("ok" if rep["ok"] else "NOT OK")
