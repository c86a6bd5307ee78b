"""Registration of KilnBackend with ExecuTorch's runtime (kiln_executorch_runtime), each case in
a fresh interpreter: import orders, KILN_SKIP_DELEGATE_REGISTRATION, idempotence, ownership."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import run_python
from kiln.executorch import save
from kiln_test_models import MLP


@pytest.fixture(scope="module")
def mlp_pte(tmp_path_factory):
    d = tmp_path_factory.mktemp("reg")
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(3, 32)
    save(model, d / "mlp.pte", (x,))
    with torch.no_grad():
        torch.save({"x": x, "y": model(x)}, d / "io.pt")
    return d


_RUN = """
import torch
from executorch.runtime import Runtime
io = torch.load(r"{d}/io.pt")
m = Runtime.get().load_program(r"{d}/mlp.pte").load_method("forward")
out = m.execute([io["x"]])[0]
torch.testing.assert_close(out, io["y"], rtol=1e-4, atol=1e-4)
print("RAN-OK")
"""


def _check(proc):
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def test_import_runtime_first(mlp_pte):
    out = _check(
        run_python(
            "import kiln_executorch_runtime\n"
            "from executorch.runtime import Runtime\n"
            "assert 'KilnBackend' in Runtime.get().backend_registry.registered_backend_names\n"
            + _RUN.format(d=mlp_pte)
        )
    )
    assert "RAN-OK" in out


def test_import_executorch_first(mlp_pte):
    out = _check(
        run_python(
            "from executorch.runtime import Runtime\n"
            "rt = Runtime.get()\n"
            "import kiln_executorch_runtime\n"
            "assert 'KilnBackend' in rt.backend_registry.registered_backend_names\n"
            + _RUN.format(d=mlp_pte)
        )
    )
    assert "RAN-OK" in out


def test_kiln_load_registers(mlp_pte):
    out = _check(
        run_python(
            f"""
            import torch, kiln
            io = torch.load(r"{mlp_pte}/io.pt")
            out = kiln.load(r"{mlp_pte}/mlp.pte").forward(io["x"])[0]
            torch.testing.assert_close(out, io["y"], rtol=1e-4, atol=1e-4)
            print("RAN-OK")
            """
        )
    )
    assert "RAN-OK" in out


_SKIP_PROBE = """
# No torch or executorch import here: whether the delegate library is mapped tells whether
# the import registered KilnBackend (loading libkiln_executorch.so registers it).
import ctypes
import kiln_executorch_runtime as rt

def mapped():
    with open("/proc/self/maps") as f:
        return "libkiln_executorch.so" in f.read()

print("REGISTERED" if mapped() else "SKIPPED")
rt.register()
rt.register()  # idempotent
assert mapped()
lib = ctypes.CDLL(str(rt.library_path()))
assert lib.kiln_executorch_owns_registration() == 1
assert lib.kiln_executorch_registration_error() == 0
print("AFTER-REGISTER-OK")
"""


@pytest.mark.parametrize("value", ["1", "true", "YES", "On", " TRUE "])
def test_skip_registration_true_values(value):
    out = _check(run_python(_SKIP_PROBE, env={"KILN_SKIP_DELEGATE_REGISTRATION": value}))
    assert "SKIPPED" in out and "AFTER-REGISTER-OK" in out


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off", "2", "maybe"])
def test_skip_registration_other_values_register(value):
    out = _check(run_python(_SKIP_PROBE, env={"KILN_SKIP_DELEGATE_REGISTRATION": value}))
    assert "REGISTERED" in out and "AFTER-REGISTER-OK" in out


def test_skipped_then_run_fails_cleanly_then_works(mlp_pte):
    out = _check(
        run_python(
            textwrap.dedent(
                f"""
                from executorch.runtime import Runtime
                import kiln_executorch_runtime as rt
                prog = Runtime.get().load_program(r"{mlp_pte}/mlp.pte")
                try:
                    prog.load_method("forward")
                except Exception as e:
                    print("REFUSED", type(e).__name__)
                rt.register()
                """
            )
            + _RUN.format(d=mlp_pte),
            env={"KILN_SKIP_DELEGATE_REGISTRATION": "1"},
        )
    )
    assert "REFUSED" in out and "RAN-OK" in out


_FOREIGN = r"""
#include <executorch/runtime/backend/interface.h>
using namespace executorch::runtime;
namespace {
class Foreign final : public BackendInterface {
  public:
    bool is_available() const override { return true; }
    Result<DelegateHandle *> init(BackendInitContext &, FreeableBuffer *,
                                  ArrayRef<CompileSpec>) const override {
        return Error::NotSupported;
    }
    Error execute(BackendExecutionContext &, DelegateHandle *, Span<EValue *>) const override {
        return Error::NotSupported;
    }
};
Foreign g_backend;
Backend g_record{"KilnBackend", &g_backend};
Error g_err = register_backend(g_record);
} // namespace
"""


@pytest.fixture(scope="module")
def foreign_backend(tmp_path_factory):
    """A tiny library that registers another backend under the name KilnBackend."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the foreign KilnBackend library")
    import executorch

    et = Path(list(executorch.__path__)[0])
    inc, lib = et / "include", et / "lib"
    c10 = inc / "executorch" / "runtime" / "core" / "portable_type" / "c10"
    if not (lib / "libexecutorch.so").is_file() or not inc.is_dir():
        pytest.skip("the executorch wheel ships no C++ SDK (libexecutorch.so + headers)")
    d = tmp_path_factory.mktemp("foreign")
    src = d / "foreign.cpp"
    src.write_text(_FOREIGN)
    out = d / "libforeign_kiln.so"
    cmd = [
        cxx, "-std=c++17", "-shared", "-fPIC", "-O0",
        "-DC10_USING_CUSTOM_GENERATED_MACROS", "-DET_EVENT_TRACER_ENABLED",
        f"-I{inc}", f"-I{c10}", str(src), "-o", str(out),
        f"-L{lib}", "-lexecutorch", f"-Wl,-rpath,{lib}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip(f"could not build the foreign library: {proc.stderr[-2000:]}")
    return out


def test_foreign_registration_is_detected(foreign_backend):
    out = _check(
        run_python(
            f"""
            import ctypes
            import executorch.runtime  # maps the wheel's libexecutorch.so
            ctypes.CDLL(r"{foreign_backend}")
            try:
                import kiln_executorch_runtime
            except Exception as e:
                print("ERROR", type(e).__name__, str(e))
            else:
                print("NO-ERROR")
            """
        )
    )
    assert "ERROR KilnRegistrationError" in out, out
    assert "another library registered" in out


def test_kiln_load_explains_an_unregistered_delegate(mlp_pte):
    out = _check(
        run_python(
            f"""
            import kiln, kiln._load
            kiln._load._register_kiln = lambda: None  # as if registration had not happened
            try:
                kiln.load(r"{mlp_pte}/mlp.pte")
            except kiln.KilnLoadError as e:
                print("LOAD-ERROR", e)
            """,
            env={"KILN_SKIP_DELEGATE_REGISTRATION": "1"},
        )
    )
    assert "LOAD-ERROR" in out and "not registered" in out and "kiln_executorch_runtime" in out
