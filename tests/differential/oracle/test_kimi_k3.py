"""kimi_k3: engine vs a PyTorch reference of the K3 text model, on tiny random checkpoints in
the released layout (MXFP4 experts, bf16 trunk; warp_providers.synth.kimi_k3).

The reference (kimi_k3_ref.py) reads the checkpoint itself and dequantizes the experts
exactly; its K3 pieces are first checked on their own against the formulas written out
element by element here, so the reference is not only checked against itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest


@pytest.fixture(scope="module")
def ref(oracle_env):
    import kimi_k3_ref

    return kimi_k3_ref


def test_situ_glu_elementwise(ref) -> None:
    import torch

    g, u = torch.randn(257) * 6, torch.randn(257) * 40
    for b2 in (25.0, None):
        got = ref.situ_glu(g, u, 4.0, b2).double().numpy()
        for i in range(257):
            gi, ui = float(g[i]), float(u[i])
            a = 4.0 * math.tanh(gi / 4.0) / (1.0 + math.exp(-gi))
            want = a * (b2 * math.tanh(ui / b2) if b2 else ui)
            assert abs(got[i] - want) <= 1e-5 * max(1.0, abs(want)), (i, b2)


def test_bounded_gate_elementwise_and_not_a_clamp(ref) -> None:
    import torch

    f, dt, a_log = torch.randn(5, 3, 4) * 3, torch.randn(3, 4), torch.randn(3)
    got = ref.bounded_gate(f, dt, a_log, -5.0).numpy()
    for t, h, i in np.ndindex(5, 3, 4):
        y = math.exp(float(a_log[h])) * (float(f[t, h, i]) + float(dt[h, i]))
        want = -5.0 / (1.0 + math.exp(-y))
        assert abs(got[t, h, i] - want) <= 1e-5
    assert (got > -5.0).all() and (got < 0).all()
    unbounded = -a_log.exp()[:, None] * torch.nn.functional.softplus(f + dt)
    assert not np.allclose(np.maximum(unbounded.numpy(), -5.0), got, atol=1e-2)


def test_attn_res_elementwise(ref) -> None:
    import torch

    eps = 1e-5
    blocks = [torch.randn(3, 8) for _ in range(2)]
    prefix, nw, pw = torch.randn(3, 8), torch.randn(8), torch.randn(1, 8)
    got = ref.attn_res(prefix, blocks, nw, pw, eps).numpy()
    for t in range(3):
        vals = [b[t].tolist() for b in blocks] + [prefix[t].tolist()]
        scores = []
        for v in vals:
            r = 1.0 / math.sqrt(sum(a * a for a in v) / 8 + eps)
            scores.append(sum(v[i] * r * float(nw[i]) * float(pw[0, i]) for i in range(8)))
        m = max(scores)
        p = [math.exp(s - m) for s in scores]
        want = [sum(p[j] * vals[j][i] for j in range(3)) / sum(p) for i in range(8)]
        assert np.abs(got[t] - np.array(want)).max() <= 1e-5


def test_mxfp4_low_nibble_first_and_e8m0(ref) -> None:
    import torch

    packed = torch.tensor([[0x21] * 16 + [0xF7] * 16], dtype=torch.uint8)  # [1, 32] bytes
    scale = torch.tensor([[127, 125]], dtype=torch.uint8)
    w = ref.mxfp4(packed, scale)[0].numpy()
    assert w.shape == (64,)
    assert w[0] == 0.5 and w[1] == 1.0           # 0x21: low nibble 1 -> 0.5, high 2 -> 1.0
    assert w[32] == 6.0 / 4 and w[33] == -6.0 / 4  # 0xF7 at 2^-2: 7 -> 6, 15 -> -6
