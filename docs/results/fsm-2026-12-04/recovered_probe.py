"""Drive vLLM's CPU C++ rejection-sampling kernels with a draft token the grammar masks (target prob 0)."""
import json, sys
import torch
import vllm  # noqa: F401
from vllm.platforms import current_platform
import vllm._C  # noqa: F401  registers torch.ops._C
from vllm.utils import cpu_triton_utils as k

torch.manual_seed(0)
V, K = 512, 3
logits = torch.randn(K, V)
mask = torch.zeros(V, dtype=torch.bool); mask[2::2] = True  # grammar: even ids >= 2
logits[:, ~mask] = float("-inf")
target = logits.softmax(-1, dtype=torch.float32)
draft = torch.tensor([25, 156, 206], dtype=torch.int64)  # first draft odd: masked, target prob 0
cu = torch.tensor([K], dtype=torch.int64)
out = {"platform": type(current_platform).__name__, "target_p_of_draft0": float(target[0, 25])}
for no_probs in (False, True):
    dprobs = None if no_probs else torch.softmax(torch.randn(K, V), -1).contiguous()
    if dprobs is not None:
        dprobs[0] = 0; dprobs[0, 25] = 1.0  # draft model sure of its (odd) draft
    inv_q = torch.empty(1, V).exponential_().reciprocal()
    rec = torch.empty(K, dtype=torch.int64)
    k._sample_recovered_tokens_kernel_impl(rec, cu, draft, dprobs, target.contiguous(), inv_q, V, NO_DRAFT_PROBS=no_probs)
    # reference: the Triton kernel's arithmetic (rejection_sampler.py sample_recovered_tokens_kernel)
    p = target.clone()
    if no_probs:
        p[torch.arange(K), draft] = 0
    else:
        p = torch.clamp(target - dprobs, min=0)
    ref = (p * inv_q[0]).argmax(-1)
    o = torch.full((1, K + 1), -1, dtype=torch.int64)
    u = torch.rand(K, dtype=torch.float64)
    k._rejection_random_sample_kernel_impl(o, cu, draft, dprobs, target.contiguous(), torch.tensor([100]), rec, u,
                                           torch.tensor([False]), K, V, NO_DRAFT_PROBS=no_probs)
    out[f"no_draft_probs={no_probs}"] = {"recovered_cpu": rec.tolist(), "recovered_ref": ref.tolist(), "output_cpu": o.tolist()}
print(json.dumps(out, indent=1))
