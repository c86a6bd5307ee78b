"""The child process of test_untrusted.py: runs a list of untrusted-file cases through one
Python surface (``kiln.load`` or ``executorch.runtime.Runtime``) and prints one JSON line per
case, so that the parent test sees every result, and a crash (a signal, an abort from a log
sink) kills only this process and names the case it happened in (the last "start" line).

    python untrusted_child.py MANIFEST.json kiln|runtime

A manifest is a list of {"id", "pte", "ptd" (or null), "input", "dims", "ref"}; input and ref
are raw float32 files. Each output line is {"id", "result", "status", "message"} with result
"ok" (output identical to ref), "differs" or "refused"; status is Kiln's status name when Kiln
diagnosed the refusal, else null.
"""

from __future__ import annotations

import faulthandler
import json
import sys

import torch


def _tensor(path: str, dims) -> torch.Tensor:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.float32).reshape(dims).clone()


def _run_kiln(case, x):
    import kiln

    try:
        y = kiln.load(case["pte"], data_path=case["ptd"]).forward(x)[0]
    except kiln.KilnLoadError as e:
        return None, e.status_name, str(e)
    return y, None, ""


def _run_runtime(case, x):
    import kiln_executorch_runtime as rt
    from executorch.runtime import Runtime

    rt.clear_error()
    # What a Runtime user does with files that may be damaged: ExecuTorch trusts the offsets of
    # a .ptd and the presence of fields in a .pte.
    try:
        rt.check_program_file(case["pte"])
        if case["ptd"] is not None:
            rt.check_data_file(case["ptd"])
    except rt.KilnRuntimeError as e:
        return None, e.status_name, str(e)
    try:
        prog = Runtime.get().load_program(case["pte"], data_path=case["ptd"])
        y = prog.load_method("forward").execute([x])[0]
    except Exception as e:  # noqa: BLE001 - pybind raises RuntimeError
        err = rt.last_error()
        if err is None:
            return None, None, str(e)
        return None, err[0], f"{e}: {err[1]}"
    return y, None, ""


def main() -> int:
    faulthandler.enable()
    torch.set_num_threads(1)
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    run = {"kiln": _run_kiln, "runtime": _run_runtime}[sys.argv[2]]
    refs = {}
    for case in cases:
        print(json.dumps({"start": case["id"]}), flush=True)
        x = _tensor(case["input"], case["dims"])
        key = case["ref"]
        if key not in refs:
            with open(key, "rb") as f:
                refs[key] = f.read()
        y, status, message = run(case, x)
        if y is not None:
            result = "ok" if y.contiguous().numpy().tobytes() == refs[key] else "differs"
        else:
            result = "refused"
        line = {"id": case["id"], "result": result, "status": status, "message": message}
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
