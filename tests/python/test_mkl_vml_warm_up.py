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
import json, torch, torch_vtpu
from torch_vtpu import _mkl_vml
print(json.dumps(sorted({(name, str(dtype)) for name, dtype in _mkl_vml.warmed})))
"""


def test_import_warms_the_vml_ops_for_float32_and_float64_once():
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    assert out.returncode == 0, out.stderr[-2000:]
    warmed = [tuple(pair) for pair in json.loads(out.stdout.strip().splitlines()[-1])]
    for name in ("exp", "log", "sqrt", "sin", "tanh", "erf", "asin"):
        for dtype in ("torch.float32", "torch.float64"):
            assert (name, dtype) in warmed, (name, dtype, warmed)


def test_the_warm_up_leaves_results_unchanged():
    from torch_vtpu import _mkl_vml
    x = torch.rand(64, 33, generator=torch.Generator().manual_seed(0)) + 0.5
    before = [torch.exp(x), torch.log(x), torch.tanh(x)]
    _mkl_vml.warm_up()
    assert all(torch.equal(b, a) for b, a in zip(before, [torch.exp(x), torch.log(x), torch.tanh(x)]))
