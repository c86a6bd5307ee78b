"""kiln-export (kiln.cli)."""

from __future__ import annotations

import textwrap

import kiln
import torch
from conftest import assert_close
from kiln.cli import main


def test_export_module_from_file(tmp_path, capsys):
    src = tmp_path / "netdef.py"
    src.write_text(
        textwrap.dedent(
            """
            import torch
            def make():
                torch.manual_seed(0)
                return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
            """
        )
    )
    out = tmp_path / "net.pte"
    rc = main(
        [f"{src}:make", str(out), "--input", "4x8", "--dynamic", "0.0=1:8", "--external-data", "w"]
    )
    assert rc == 0, capsys.readouterr().err
    assert "1 Kiln delegate call" in capsys.readouterr().out
    assert (tmp_path / "w.ptd").is_file()
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert_close(kiln.load(out, data_path=tmp_path / "w.ptd").forward(x), [ref(x)])


def test_export_pt2(tmp_path):
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()).eval()
    ep = torch.export.export(m, (torch.randn(2, 4),))
    torch.export.save(ep, tmp_path / "m.pt2")
    assert main([str(tmp_path / "m.pt2"), str(tmp_path / "m.pte"), "--precision", "fp16"]) == 0
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert_close(kiln.load(tmp_path / "m.pte").forward(x), [m(x)], precision="fp16")


def test_cli_errors(tmp_path, capsys):
    assert main(["nope.pt2", str(tmp_path / "a.pte")]) == 2
    assert "no file" in capsys.readouterr().err
    assert main(["torch.nn:Linear", str(tmp_path / "a.pte")]) == 2
    assert "kiln-export: error:" in capsys.readouterr().err  # Linear() needs arguments
    assert main(["torch.nn:ReLU", str(tmp_path / "a.pte")]) == 2
    assert "needs --input" in capsys.readouterr().err
    assert main(["torch.nn:ReLU", str(tmp_path / "a.pte"), "--input", "2xq"]) == 2
    assert "SHAPE must look like" in capsys.readouterr().err
    assert main(["torch.nn:ReLU", str(tmp_path / "a.pte"), "--input", "2x3:complex"]) == 2
    assert "unknown dtype" in capsys.readouterr().err
    args = ["torch.nn:ReLU", str(tmp_path / "a.pte"), "--input", "2x3", "--dynamic", "1.0=1:4"]
    assert main(args) == 2
    assert "input 1 does not exist" in capsys.readouterr().err
    args = ["torch.nn:ReLU", str(tmp_path / "a.pte"), "--input", "2", "--external-data", "../x"]
    assert main(args) == 2
    assert "external_data" in capsys.readouterr().err
