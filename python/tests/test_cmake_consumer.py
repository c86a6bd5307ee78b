"""C and C++ consumers of the INSTALLED Kiln wheel through its CMake package (find_package(Kiln)):
the examples (examples/c, examples/cpp) built and run, the C program API's results and error
paths (tests/consumer/api), the package's version and repeat rules (tests/consumer/find), RUNPATH
for consumers (tests/consumer/engine), and the ELF facts of libkiln_executorch.so.

Paths come from ``python -m kiln_executorch_runtime --cmake-prefix-path``. Needs CMake >= 3.28
(the venv's), a C/C++ compiler, readelf and nm; skipped otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CONSUMER = ROOT / "tests" / "consumer"
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str | None:
    local = BIN / name
    return str(local) if local.exists() else shutil.which(name)


CMAKE = _tool("cmake")
NINJA = _tool("ninja")


def _cmake_version(cmake: str | None) -> tuple[int, ...]:
    if cmake is None:
        return (0,)
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0,)


pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
    pytest.mark.skipif(_cmake_version(CMAKE) < (3, 28), reason="needs CMake >= 3.28"),
    pytest.mark.skipif(
        not (shutil.which("readelf") and shutil.which("nm") and shutil.which("cc")),
        reason="needs readelf, nm and a C compiler",
    ),
]


def _env() -> dict:
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)  # binaries must find their libraries by RUNPATH
    env.pop("KILN_SKIP_DELEGATE_REGISTRATION", None)
    return env


def _run(cmd, timeout=600, check=True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=_env(), **kw
    )
    if check and p.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))} exited {p.returncode}\n"
            f"stdout:\n{p.stdout[-6000:]}\nstderr:\n{p.stderr[-6000:]}"
        )
    return p


@pytest.fixture(scope="module")
def prefix_path() -> str:
    p = _run([sys.executable, "-m", "kiln_executorch_runtime", "--cmake-prefix-path"])
    return p.stdout.strip()


@pytest.fixture(scope="module")
def runtime_pkg(prefix_path) -> Path:
    first = Path(prefix_path.split(";")[0])  # <site-packages>/kiln_executorch_runtime/lib/cmake
    assert first.name == "cmake" and first.parent.name == "lib", prefix_path
    return first.parent.parent


def _configure(src: Path, build: Path, prefix_path: str, *args, check=True):
    cmd = [CMAKE, "-S", src, "-B", build, f"-DCMAKE_PREFIX_PATH={prefix_path}"]
    if NINJA:
        cmd += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={NINJA}"]
    return _run(cmd + list(args), check=check)


def _build(build: Path):
    return _run([CMAKE, "--build", build, "-j2"])


def _dynamic(path: Path) -> dict:
    """NEEDED, RUNPATH and RPATH entries of an ELF file."""
    out = _run(["readelf", "-d", path]).stdout
    res = {"NEEDED": [], "RUNPATH": None, "RPATH": None}
    for line in out.splitlines():
        m = re.search(r"\((NEEDED|RUNPATH|RPATH)\)\s+.*?\[(.*)\]", line)
        if m:
            if m.group(1) == "NEEDED":
                res["NEEDED"].append(m.group(2))
            else:
                res[m.group(1)] = m.group(2).split(":")
    return res


# --- fixtures: programs exported with Kiln and with plain ExecuTorch


class TwoOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 4)

    def forward(self, x, y):
        return self.l2(torch.relu(self.l1(x))) + y, (x * 2).sum(dim=1)


class _Method(torch.nn.Module):
    """One method of a shared module (its forward is module.<name>)."""

    def __init__(self, module, name):
        super().__init__()
        self.module, self.name = module, name

    def forward(self, x):
        return getattr(self.module, self.name)(x)


class Accumulate(torch.nn.Module):
    """An accumulator two methods update: `add` adds x, `add2` adds 2 x; each returns it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(4))

    def add(self, x):
        self.acc.add_(x)
        return self.acc * 1.0

    def add2(self, x):
        self.acc.add_(2 * x)
        return self.acc * 1.0


def _kiln_tensors():
    sys.path.insert(0, str(EXAMPLES / "cpp"))
    try:
        import kiln_tensors
    finally:
        sys.path.pop(0)
    return kiln_tensors


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> Path:
    """The fixtures tests/consumer/api/check_program_api.c documents."""
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from kiln.executorch import KilnPartitioner

    d = tmp_path_factory.mktemp("programs")
    torch.manual_seed(0)
    m = TwoOut().eval()
    x, y = torch.randn(3, 16), torch.randn(3, 4)
    unplanned = ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False)
    )

    def lower_ep(ep, partitioner, config=None):
        edge = to_edge_transform_and_lower(ep, partitioner=partitioner)
        return edge.to_executorch(config or ExecutorchBackendConfig())

    def lower(partitioner, config=None):
        return lower_ep(torch.export.export(m, (x, y)), partitioner, config)

    (d / "plain.pte").write_bytes(lower([]).buffer)
    (d / "unplanned.pte").write_bytes(lower([], unplanned).buffer)
    (d / "kiln.pte").write_bytes(lower([KilnPartitioner()]).buffer)
    (d / "kiln_unplanned.pte").write_bytes(lower([KilnPartitioner()], unplanned).buffer)
    prog = lower([KilnPartitioner(external_data="kilnx")])
    (d / "kilnx.pte").write_bytes(prog.buffer)
    prog.write_tensor_data_to_file(str(d))
    assert (d / "kilnx.ptd").exists()
    with torch.no_grad():
        o0, o1 = m(x, y)
    _kiln_tensors().write(d / "io.bin", [x, y, o0, o1])
    batch = torch.export.Dim("batch", min=1, max=8)
    ep = torch.export.export(m, (x, y), dynamic_shapes=({0: batch}, {0: batch}))
    (d / "dyn.pte").write_bytes(lower_ep(ep, [KilnPartitioner()]).buffer)
    x2, y2 = torch.randn(2, 16), torch.randn(2, 4)
    with torch.no_grad():
        d0, d1 = m(x2, y2)
    _kiln_tensors().write(d / "io_dyn.bin", [x2, y2, d0, d1])

    # Methods that update one buffer outside every delegate: ExecuTorch's shared arena
    # (share_mutable_buffers). state.pte: ExecuTorch only, the calls add, add2, add; io_state.bin:
    # their inputs, then eager's outputs. state_kiln.pte: kiln's save (it turns the sharing on
    # itself), the calls fill, step, step; io_state_kiln.bin likewise.
    import copy

    from executorch.exir import to_edge
    from kiln.executorch import save

    acc = Accumulate()
    a = {m: torch.export.export(_Method(acc, m), (torch.randn(4),)) for m in ("add", "add2")}
    shared = ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True)
    )
    (d / "state.pte").write_bytes(to_edge(a).to_executorch(shared).buffer)
    xs = [torch.randn(4) for _ in range(3)]
    ref = Accumulate()
    want = [ref.add(xs[0]), ref.add2(xs[1]), ref.add(xs[2])]
    _kiln_tensors().write(d / "io_state.bin", [*xs, *want])
    from kiln_test_models import RingCounter

    torch.manual_seed(4)
    ring = RingCounter().eval()
    fresh = copy.deepcopy(ring)
    save(
        {"fill": (ring, (torch.randn(3, 4),)), "step": (ring, (torch.randn(1, 4),))},
        d / "state_kiln.pte",
        quiet=True,
    )
    xs = [torch.randn(3, 4), torch.randn(1, 4), torch.randn(1, 4)]
    with torch.no_grad():
        want = [fresh(x) for x in xs]
    _kiln_tensors().write(d / "io_state_kiln.bin", [*xs, *want])
    return d


# --- the installed package and the delegate library


def test_kiln_tensors_roundtrip(tmp_path):
    kt = _kiln_tensors()
    ts = [
        torch.randn(2, 3),
        torch.randn(4).to(torch.float16),
        torch.randn(1, 2, 3).to(torch.bfloat16),
        torch.randint(-5, 5, (3,), dtype=torch.int32),
        torch.randint(-5, 5, (2, 2), dtype=torch.int64),
        torch.rand(5) > 0.5,
        torch.tensor(3.5),
        torch.empty(0, 4),
    ]
    kt.write(tmp_path / "t.bin", ts)
    back = kt.read(tmp_path / "t.bin")
    assert len(back) == len(ts)
    for a, b in zip(back, ts, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    raw = (tmp_path / "t.bin").read_bytes()
    assert raw[:4] == b"KLNT" and int.from_bytes(raw[8:12], "little") == len(ts)
    (tmp_path / "bad.bin").write_bytes(raw[:-1])
    with pytest.raises(ValueError, match="truncated"):
        kt.read(tmp_path / "bad.bin")


def test_package_layout(prefix_path, runtime_pkg):
    et = Path(prefix_path.split(";")[1])
    assert (et / "executorch-config.cmake").exists(), prefix_path
    for rel in (
        "lib/libkiln.so",
        "lib/libkiln_executorch.so",
        "lib/cmake/Kiln/KilnConfig.cmake",
        "lib/cmake/Kiln/KilnConfigVersion.cmake",
        "include/kiln/kiln.h",
        "include/kiln/kiln_program.h",
    ):
        assert (runtime_pkg / rel).is_file(), rel
    config = (runtime_pkg / "lib/cmake/Kiln/KilnConfig.cmake").read_text()
    # Relocatable: nothing absolute from the build machine.
    for absolute in (str(ROOT), str(runtime_pkg), str(et.parent.parent.parent)):
        assert absolute not in config, absolute
    assert "CMAKE_CURRENT_FUNCTION_LIST_DIR" in config


def test_delegate_library_elf(runtime_pkg):
    lib = runtime_pkg / "lib" / "libkiln_executorch.so"
    dyn = _dynamic(lib)
    assert dyn["RUNPATH"] == ["$ORIGIN", "$ORIGIN/../../executorch/lib"], dyn
    assert dyn["RPATH"] is None
    assert "libexecutorch.so" in dyn["NEEDED"] and "libkiln.so" in dyn["NEEDED"]
    # One ExecuTorch runtime per process: nothing else of ExecuTorch, torch or Python.
    for n in dyn["NEEDED"]:
        assert not re.match(r"lib(executorch_|torch|c10|python)", n), n
    # Exported symbols: exactly the C API of kiln_program.h.
    header = (ROOT / "include/kiln/kiln_program.h").read_text()
    declared = set(re.findall(r"KILN_API\s+[\w\s\*]+?\b(kiln_\w+)\s*\(", header))
    assert len(declared) >= 20, declared
    exported = {
        line.split()[-1]
        for line in _run(["nm", "-D", "--defined-only", lib]).stdout.splitlines()
        if line.strip()
    }
    assert exported == declared, (sorted(exported - declared), sorted(declared - exported))
    # ExecuTorch's runtime is imported from libexecutorch.so, not carried inside.
    undefined = _run(["nm", "-D", "--undefined-only", "-C", lib]).stdout
    assert "executorch::runtime::register_backend" in undefined
    assert "executorch::extension::module::Module::load" in undefined


# --- the C program API


def test_c_program_api(tmp_path, prefix_path, programs):
    build = tmp_path / "api"
    _configure(CONSUMER / "api", build, prefix_path)
    _build(build)
    p = _run([build / "check_program_api", programs], check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"\b[1-9]\d* passed, 0 failed", p.stdout), p.stdout


# --- examples


def test_c_example(tmp_path, prefix_path, runtime_pkg, programs):
    build = tmp_path / "c"
    # --as-needed on purpose: the delegate must stay linked (its registration is all it does).
    _configure(EXAMPLES / "c", build, prefix_path, "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed")
    _build(build)
    exe = build / "kiln_c_example"
    dyn = _dynamic(exe)
    assert "libkiln_executorch.so" in dyn["NEEDED"], dyn
    assert str(runtime_pkg / "lib") in dyn["RUNPATH"], dyn
    sums = {}
    for name in ("kiln", "plain"):
        p = _run([exe, programs / f"{name}.pte", "--seed", "7"])
        assert ("runs in Kiln" if name == "kiln" else "no Kiln delegate") in p.stdout
        sums[name] = [float(s) for s in re.findall(r"sum=(\S+)", p.stdout)]
        assert len(sums[name]) == 2, p.stdout
    for a, b in zip(sums["kiln"], sums["plain"], strict=True):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), sums
    p = _run([exe, programs / "kilnx.pte", "--data", programs / "kilnx.ptd", "--seed", "7"])
    assert [float(s) for s in re.findall(r"sum=(\S+)", p.stdout)] == pytest.approx(sums["kiln"])
    p = _run([exe, programs / "kilnx.pte"], check=False)
    assert p.returncode == 1 and "missing external data" in p.stderr, p.stderr
    p = _run([exe, programs / "kiln.pte", "--option", "num_threads=2"])
    assert "runs in Kiln" in p.stdout


def test_llm_generate_c(tmp_path, prefix_path):
    """examples/llm/generate.c: greedy generation through the C program API over the prefill and
    decode methods of a decoder whose cache lives in the Kiln engine gives the tokens Python's
    kiln.load gives (and eager PyTorch: test_llm_cache.py)."""
    import kiln
    import torch
    from kiln.executorch import save

    sys.path.insert(0, str(EXAMPLES / "llm"))
    try:
        from tiny_llama import TinyLlama, example_inputs
    finally:
        sys.path.pop(0)
    model = TinyLlama(seed=9).eval()
    args, dyn = example_inputs(model.c)
    one = (torch.zeros(1, 1, dtype=torch.int64), torch.tensor([0]))
    pte = tmp_path / "llm.pte"
    save(
        {"prefill": (model, args, dyn), "decode": (model, one)},
        pte,
        external_data="llm",
        quiet=True,
    )
    prompt = [5, 17, 42, 99, 3, 250, 7]
    program = kiln.load(pte, data_path=tmp_path / "llm.ptd")
    n = len(prompt)
    logits = program.run("prefill", [torch.tensor([prompt]), torch.arange(n)])[0]
    want = [int(logits.argmax())]
    for i in range(11):
        logits = program.run("decode", [torch.tensor([[want[-1]]]), torch.tensor([n + i])])[0]
        want.append(int(logits.argmax()))
    build = tmp_path / "llm_build"
    _configure(EXAMPLES / "llm", build, prefix_path)
    _build(build)
    exe = build / "kiln_llm_generate"
    args_c = [pte, "--data", tmp_path / "llm.ptd", "--prompt", ",".join(map(str, prompt))]
    p = _run([exe, *args_c, "--tokens", "12"])
    got = [int(t) for t in re.search(r"tokens:((?: \d+)*)", p.stdout).group(1).split()]
    assert got == want, (got, want, p.stdout)
    assert "ms/token" in p.stdout, p.stdout
    # A prompt that runs past the cache is refused, naming the position (nothing corrupted).
    long_prompt = ",".join(["1"] * 8)
    p = _run(
        [
            exe,
            pte,
            "--data",
            tmp_path / "llm.ptd",
            "--prompt",
            long_prompt,
            "--tokens",
            str(model.c.max_seq),
        ],
        check=False,
    )
    assert p.returncode == 1 and "out of range" in p.stderr, p.stdout + p.stderr


def test_cpp_runner_bundle(tmp_path, prefix_path, runtime_pkg):
    sys.path.insert(0, str(EXAMPLES / "cpp"))
    try:
        from export_for_runner import save_for_runner
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.Linear(48, 6)
    ).eval()
    planned = save_for_runner(model, (torch.randn(5, 24),), tmp_path / "planned")
    caller = save_for_runner(
        model, (torch.randn(5, 24),), tmp_path / "caller", external_data=True, device_io=True
    )

    build = tmp_path / "runner"
    _configure(EXAMPLES / "cpp", build, prefix_path, "-DKILN_RUNNER_BUNDLE=ON")
    _build(build)
    bundle = tmp_path / "bundle-copy"
    shutil.copytree(build / "bundle", bundle)
    names = sorted(f.name for f in bundle.iterdir())
    for need in (
        "kiln_runner",
        "libexecutorch.so",
        "libexecutorch_kernels_optimized.so",
        "libexecutorch_threadpool.so",
        "libkiln.so",
        "libkiln_executorch.so",
    ):
        assert need in names, names
    exe = bundle / "kiln_runner"
    dyn = _dynamic(exe)
    assert dyn["RUNPATH"][0] == "$ORIGIN", dyn
    assert str(runtime_pkg / "lib") not in dyn["RUNPATH"], dyn  # KILN_EMBED_RUNPATH off
    # Every Kiln/ExecuTorch library resolves inside the copied bundle.
    ldd = _run(["ldd", exe]).stdout
    for line in ldd.splitlines():
        if "kiln" in line or "executorch" in line:
            assert str(bundle) in line, ldd

    p = _run(
        [
            exe,
            "--model",
            planned["pte"],
            "--inputs",
            planned["inputs"],
            "--expected",
            planned["expected"],
            "--tolerance",
            "1e-4",
            "--iterations",
            "5",
            "--warmup",
            "1",
        ]
    )
    assert "delegates to KilnBackend" in p.stdout and "kiln_runner: OK" in p.stdout, p.stdout
    assert re.search(r"median [\d.]+ ms", p.stdout)
    p = _run(
        [
            exe,
            "--model",
            caller["pte"],
            "--data",
            caller["ptd"],
            "--inputs",
            caller["inputs"],
            "--expected",
            caller["expected"],
            "--iterations",
            "2",
            "--save-outputs",
            tmp_path / "out.bin",
        ]
    )
    assert "kiln_runner: OK" in p.stdout, p.stdout
    saved = _kiln_tensors().read(tmp_path / "out.bin")
    expected = _kiln_tensors().read(caller["expected"])
    torch.testing.assert_close(saved[0], expected[0], rtol=1e-4, atol=1e-4)
    # A wrong expectation fails (exit 1) and says where.
    p = _run(
        [
            exe,
            "--model",
            planned["pte"],
            "--inputs",
            planned["inputs"],
            "--expected",
            caller["expected"],
            "--iterations",
            "1",
        ],
        check=False,
    )
    assert p.returncode == 1 and "MISMATCH" in p.stdout, p.stdout
    p = _run([exe, "--model", planned["pte"], "--method", "nope"], check=False)
    assert p.returncode == 1 and "its methods: forward" in p.stderr, p.stderr


# --- the package's rules (configure only)


@pytest.mark.parametrize(
    "request_, found",
    [
        ("0.1", True),
        ("0.0.3", True),
        ("0.1.0", True),
        ("0.1...<1", True),  # exclusive next-major upper bound
        ("0.1...0.9", True),
        ("0.2", False),  # newer than installed
        ("1.0", False),  # next major
        ("0.1...<2", False),  # a range across majors
        ("0.1...1.5", False),
        ("0.0.1...<0.0.9", False),  # installed above the range
    ],
)
def test_version_rules(tmp_path, prefix_path, request_, found):
    p = _configure(
        CONSUMER / "find", tmp_path / "b", prefix_path, "-DCASE=version", f"-DREQUEST={request_}"
    )
    assert "KILN_CASE_OK" in p.stdout
    assert f"KILN_CASE_FOUND={1 if found else 0}" in p.stdout, p.stdout


def test_required_range_across_majors_fails(tmp_path, prefix_path):
    p = _configure(
        CONSUMER / "find",
        tmp_path / "b",
        prefix_path,
        "-DCASE=required",
        "-DREQUEST=0.1...<2",
        check=False,
    )
    assert p.returncode != 0
    text = " ".join(p.stderr.split())  # CMake wraps its messages
    assert 'compatible with requested version range "0.1...<2"' in text, p.stderr
    assert "version: 0.1.0" in text


@pytest.mark.parametrize("case", ["repeat", "conflict", "components"])
def test_find_package_rules(tmp_path, prefix_path, case):
    p = _configure(CONSUMER / "find", tmp_path / "b", prefix_path, f"-DCASE={case}", check=False)
    assert p.returncode == 0 and "KILN_CASE_OK" in p.stdout, p.stdout + p.stderr
    if case == "conflict":
        assert "two Kiln installations" in p.stdout
    if case == "components":
        assert "unknown component 'no_such_component'" in p.stdout


def test_executorch_release_mismatch(tmp_path, prefix_path):
    fake = tmp_path / "executorch-1.6"
    fake.mkdir()
    (fake / "executorch-config.cmake").write_text(
        'set(EXECUTORCH_BUILD_VERSION "1.6.0+cpu")\nset(executorch_FOUND TRUE)\n'
        "if(NOT TARGET executorch::runtime)\n"
        "  add_library(executorch::runtime SHARED IMPORTED)\n"
        '  set_target_properties(executorch::runtime PROPERTIES IMPORTED_LOCATION "/x/lib.so")\n'
        "endif()\n"
    )
    (fake / "executorch-config-version.cmake").write_text(
        'set(PACKAGE_VERSION "1.6.0")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n'
    )
    p = _configure(
        CONSUMER / "find",
        tmp_path / "b",
        prefix_path,
        "-DCASE=etmismatch",
        f"-Dexecutorch_DIR={fake}",
        check=False,
    )
    assert p.returncode == 0 and "KILN_CASE_OK" in p.stdout, p.stdout + p.stderr
    assert "built against executorch 1.5.1" in p.stdout and "1.6.0+cpu" in p.stdout, p.stdout


# --- RUNPATH for consumers of kiln::kiln


@pytest.mark.parametrize("embed", [True, False])
def test_engine_consumer_runpath_with_old_dtags(tmp_path, prefix_path, runtime_pkg, embed):
    build = tmp_path / "engine"
    _configure(
        CONSUMER / "engine",
        build,
        prefix_path,
        "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags",
        f"-DKILN_EMBED_RUNPATH={'ON' if embed else 'OFF'}",
    )
    _build(build)
    exe = build / "kiln_engine_consumer"
    dyn = _dynamic(exe)
    libdir = str(runtime_pkg / "lib")
    if embed:
        assert dyn["RPATH"] is None and libdir in dyn["RUNPATH"], dyn
    else:  # the toolchain's default (old tags) stays: CMake's own build RPATH
        assert dyn["RUNPATH"] is None and libdir in dyn["RPATH"], dyn
    p = _run([exe])
    assert p.stdout.startswith("kiln 0.1.0")


def test_relocated_package(tmp_path, prefix_path, runtime_pkg):
    moved = tmp_path / "moved" / "kiln_executorch_runtime"
    shutil.copytree(runtime_pkg, moved, ignore=shutil.ignore_patterns("__pycache__"))
    prefix = ";".join([str(moved / "lib" / "cmake")] + prefix_path.split(";")[1:])
    build = tmp_path / "engine"
    _configure(CONSUMER / "engine", build, prefix)
    _build(build)
    dyn = _dynamic(build / "kiln_engine_consumer")
    assert str(moved / "lib") in dyn["RUNPATH"] and str(runtime_pkg / "lib") not in dyn["RUNPATH"]
    _run([build / "kiln_engine_consumer"])


@pytest.mark.skipif(
    not (3, 19) <= _cmake_version(shutil.which("cmake")) < (3, 28),
    reason="needs a system CMake between 3.19 and 3.28 (e.g. Debian 12's 3.25)",
)
def test_old_cmake_gets_the_engine_and_a_clear_message(tmp_path, prefix_path):
    cmake = shutil.which("cmake")
    build = tmp_path / "engine"
    _run([cmake, "-S", CONSUMER / "engine", "-B", build, f"-DCMAKE_PREFIX_PATH={prefix_path}"])
    _run([cmake, "--build", build, "-j2"])
    _run([build / "kiln_engine_consumer"])
    p = _run(
        [
            cmake,
            "-S",
            CONSUMER / "engine",
            "-B",
            tmp_path / "probe",
            f"-DCMAKE_PREFIX_PATH={prefix_path}",
            "-DKILN_PROBE_BACKEND=ON",
        ]
    )
    assert "KILN_PROBE found=0" in p.stdout and "needs CMake >= 3.28" in p.stdout, p.stdout
