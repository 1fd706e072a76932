"""Library ceiling: GemLite's Triton A16W4 kernels (pip package gemlite), asymmetric int4, group 128.

The model's codes are unpacked once per weight version into the (N, K) uint8 matrix GemLite packs
itself; scales and zeros are passed as they are, so GemLite computes (q - zero) * scale like the
reference (in its default fma form q * scale - zero * scale).
"""
import torch

_LAYERS = {}  # id(model) -> (key, GemLite layer); kept outside the module so state_dict is untouched


def is_available() -> bool:
    try:
        if not torch.cuda.is_available():
            return False
        from gemlite.core import DType, GemLiteLinearTriton  # noqa: F401
        return True
    except Exception:
        return False


def _codes(qweight: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(8, dtype=torch.int32, device=qweight.device) * 4
    codes = (qweight[:, :, None] >> shifts) & 0xF
    return codes.reshape(qweight.shape[0], -1).to(torch.uint8)


def _layer(model):
    key = tuple((t.data_ptr(), t._version) for t in (model.qweight, model.scales, model.zeros))
    cached = _LAYERS.get(id(model))
    if cached is not None and cached[0] == key:
        return cached[1]
    from gemlite.core import DType, GemLiteLinearTriton

    N, K = model.qweight.shape[0], model.qweight.shape[1] * 8
    layer = GemLiteLinearTriton(
        W_nbits=4, group_size=128, in_features=K, out_features=N,
        input_dtype=DType.BF16, output_dtype=DType.BF16,
    )
    layer.pack(_codes(model.qweight), model.scales, model.zeros, bias=None)
    _LAYERS[id(model)] = (key, layer)
    return layer


def sota_forward(model, x: torch.Tensor) -> torch.Tensor:
    return _layer(model)(x)
