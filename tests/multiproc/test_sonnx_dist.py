"""A model exported by PyTorch (torch.onnx.export), imported by sonnx and fine-tuned data-parallel with DistOpt
on 2 shm ranks: both ranks end with the same parameters, equal to one process training on the whole batches
(DistOpt averages the halves' gradients), and the imported weights moved. Scenario: helpers/sonnx_cases.py."""
import numpy as np
import pytest

from singa_lite import _core

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")
pytest.importorskip("onnx", reason="the onnx extra is not installed: pip install 'singa_lite[onnx]'")
pytest.importorskip("torch", reason="the parity extra (torch) is not installed")

import sonnx_cases  # noqa: E402
from dist_cases import run_ranks  # noqa: E402


def test_a_pytorch_model_fine_tunes_on_two_ranks_like_one_process_on_whole_batches():
    model_bytes = sonnx_cases.torch_model_bytes()
    out, _, _ = run_ranks(sonnx_cases.fine_tune, 2, timeout=240, args=(model_bytes,))
    assert sorted(out) == [0, 1] and all(v[0] == "ok" for v in out.values()), out
    (_, (losses0, p0)), (_, (losses1, p1)) = out[0], out[1]
    ref_losses, ref = sonnx_cases.train(model_bytes)
    assert sorted(p0) == sorted(ref) == sorted(["w_0_weight", "w_0_bias", "w_3_weight", "w_3_bias", "head.W",
                                                 "head.b"])
    for k in ref:
        np.testing.assert_array_equal(p0[k], p1[k], err_msg=f"ranks differ: {k}")
        np.testing.assert_allclose(p0[k], ref[k], rtol=1e-4, atol=1e-5, err_msg=f"2 ranks vs 1 process: {k}")
    # the mean of the two halves' losses is the whole batch's loss, step by step
    np.testing.assert_allclose((np.array(losses0) + np.array(losses1)) / 2, ref_losses, rtol=1e-4, atol=1e-5)
    assert ref_losses[-1] < ref_losses[0], ref_losses
    import onnx
    from onnx import numpy_helper

    imported = {t.name: numpy_helper.to_array(t) for t in onnx.load_from_string(model_bytes).graph.initializer}
    assert not np.allclose(p0["w_0_weight"], imported["0.weight"])  # the imported weights were fine-tuned
