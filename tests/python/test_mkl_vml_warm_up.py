"""`import torch_vtpu` resolves MKL VML's dispatch of ATen's unary ops before
any kernel runs (torch_vtpu/_mkl_vml.py, pytorch/pytorch#188792). The race
itself needs a storm of fresh processes on busy cores and is measured by
tools/vml_first_call_race.py, not here."""
import json
import os
import subprocess
import sys

import torch

PROGRAM = r"""
import json, torch
torch.set_default_device("meta")  # the warm-up must still run on the CPU
import torch_vtpu
from torch_vtpu import _mkl_vml
print(json.dumps({"ops": len(_mkl_vml._OPS),
                  "warmed": [(name, str(dtype), device) for name, dtype, device in _mkl_vml.warmed]}))
"""


def test_import_warms_every_vml_op_once_per_float_dtype_on_the_cpu():
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    warmed = [tuple(entry) for entry in report["warmed"]]
    assert len(warmed) == 2 * report["ops"], warmed  # each op once per dtype, import alone
    assert {device for _, _, device in warmed} == {"cpu"}, warmed
    for name in ("exp", "log", "sqrt", "sin", "tanh", "erf", "asin"):
        for dtype in ("torch.float32", "torch.float64"):
            assert (name, dtype, "cpu") in warmed, (name, dtype, warmed)
