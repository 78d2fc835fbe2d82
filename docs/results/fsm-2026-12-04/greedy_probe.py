import json, torch, vllm, vllm._C  # noqa
from vllm.utils import cpu_triton_utils as k
torch.manual_seed(0)
V, K = 512, 3
logits = torch.randn(K, V); logits[:, 1::2] = float("-inf"); logits[:, 0] = float("-inf")
am = logits.argmax(-1)
res = {}
for name, draft in {"draft0_masked": [25, 156, 206], "draft0_valid_not_argmax": [int(am[0]) + 2, 156, 206],
                    "draft0_is_argmax": [int(am[0]), 157, 206]}.items():
    o = torch.full((1, K + 1), -1, dtype=torch.int32)
    k._rejection_greedy_sample_kernel_impl(o, torch.tensor([K]), torch.tensor(draft), am, torch.tensor([[100]]), None, K)
    res[name] = {"draft": draft, "target_argmax": am.tolist(), "output_cpu": o.tolist()}
print(json.dumps(res))
