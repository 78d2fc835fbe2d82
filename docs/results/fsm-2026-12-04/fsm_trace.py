"""Scratch instrumentation (not shipped): bitmask rows vs request order and drafts, per step."""
from __future__ import annotations

import json
import os
from typing import Any

PATH = os.environ.get("FSM_TRACE_FILE", "/tmp/fsm-trace.jsonl")
_N = {"k": 0}


def _w(rec: dict) -> None:
    rec["pid"] = os.getpid()
    with open(PATH, "a") as f:
        f.write(json.dumps(rec, default=str) + "\n")


def _rows_free(bm: Any) -> list[bool]:
    return [bool((r == -1).all()) for r in bm]


def patch_runner(mod: Any) -> None:
    orig = mod.apply_grammar_bitmask
    import torch

    def traced(scheduler_output: Any, grammar_output: Any, input_batch: Any, logits: Any) -> None:
        _N["k"] += 1
        spec = scheduler_output.scheduled_spec_decode_tokens
        fin_before = torch.isfinite(logits).sum(dim=1).tolist()
        nan_before = torch.isnan(logits).any(dim=1).tolist()
        orig(scheduler_output, grammar_output, input_batch, logits)
        fin_after = torch.isfinite(logits).sum(dim=1).tolist()
        odd = logits[:, 1::2]
        rows_allow_odd = torch.isfinite(odd).any(dim=1).tolist()
        _w({"w": "apply", "n": _N["k"], "batch": list(input_batch.req_ids),
            "worker_spec": {r: list(spec.get(r, ())) for r in input_batch.req_ids},
            "so_ids": grammar_output.structured_output_request_ids,
            "rows_free": _rows_free(grammar_output.grammar_bitmask),
            "logit_rows": logits.shape[0], "rows_allow_odd": rows_allow_odd,
            "fin_before": fin_before, "nan_before": nan_before, "fin_after": fin_after,
            "dtype": str(logits.dtype),
            "bm_allowed": [int(sum(bin(int(x) & 0xFFFFFFFF).count("1") for x in r)) for r in grammar_output.grammar_bitmask]})

    mod.apply_grammar_bitmask = traced
    cls = mod.GPUModelRunner
    orig_sample = cls._sample

    def _sample(self: Any, logits: Any, md: Any) -> Any:
        out = orig_sample(self, logits, md)
        _w({"w": "sample", "n": _N["k"], "batch": list(self.input_batch.req_ids),
            "drafts": None if md is None else md.draft_token_ids.tolist(),
            "num_draft": None if md is None else list(md.num_draft_tokens),
            "sampled": out.sampled_token_ids.tolist()})
        return out

    cls._sample = _sample


def patch_scheduler(mod: Any) -> None:
    cls = mod.Scheduler
    orig_upd = cls.update_draft_token_ids_in_output
    orig_gb = cls.get_grammar_bitmask

    def upd(self: Any, draft: Any, so: Any) -> None:
        before = {r: list(d) for r, d in zip(draft.req_ids, draft.draft_token_ids)}
        orig_upd(self, draft, so)
        _w({"e": "update_drafts", "step_drafts": before,
            "sched_spec": {r: list(v) for r, v in so.scheduled_spec_decode_tokens.items()}})

    def gb(self: Any, so: Any) -> Any:
        out = orig_gb(self, so)
        if out is not None:
            _w({"e": "bitmask", "order": list(so.num_scheduled_tokens),
                "so_ids": out.structured_output_request_ids,
                "sched_spec": {r: list(so.scheduled_spec_decode_tokens.get(r, ())) for r in out.structured_output_request_ids},
                "rows_free": _rows_free(out.grammar_bitmask),
                "out_tok": {r: list(self.requests[r].output_token_ids)[-3:] for r in out.structured_output_request_ids if r in self.requests},
                "pending": so.pending_structured_output_tokens})
        return out

    cls.update_draft_token_ids_in_output = upd
    cls.get_grammar_bitmask = gb


def install(after_import: Any) -> None:
    if os.environ.get("FSM_FIX_EXPAND") == "1":
        after_import("vllm.utils.cpu_triton_utils", fix_expand)
    if os.environ.get("FSM_FIX_ONLY") == "1":
        return
    after_import("vllm.v1.worker.gpu_model_runner", patch_runner)
    after_import("vllm.v1.core.sched.scheduler", patch_scheduler)
    install_rs(after_import)
    after_import("vllm.v1.sample.rejection_sampler", patch_rs2)


def patch_rs(mod: Any) -> None:
    orig_rs = mod.rejection_sample
    orig_rec = mod.sample_recovered_tokens
    orig_u = mod.generate_uniform_probs
    seen: dict = {}

    def rec(*a: Any, **kw: Any) -> Any:
        out = orig_rec(*a, **kw)
        seen["rec"] = out.tolist()
        return out

    def uni(*a: Any, **kw: Any) -> Any:
        out = orig_u(*a, **kw)
        seen["u"] = out.tolist()
        return out

    def rs(draft_token_ids: Any, num_draft_tokens: Any, max_spec_len: Any, cu: Any, draft_probs: Any,
           target_logits: Any, bonus: Any, sm: Any, *a: Any, **kw: Any) -> Any:
        import torch
        seen.clear()
        tp = target_logits.softmax(-1, dtype=torch.float32)
        idx = torch.arange(draft_token_ids.shape[0])
        d = draft_token_ids.long()
        out = orig_rs(draft_token_ids, num_draft_tokens, max_spec_len, cu, draft_probs, target_logits, bonus, sm,
                      *a, **kw)
        _w({"w": "rs", "drafts": d.tolist(), "target_p_draft": tp[idx, d].tolist(),
            "draft_p_draft": None if draft_probs is None else draft_probs[idx, d].tolist(),
            "draft_probs_shape": None if draft_probs is None else list(draft_probs.shape),
            "draft_probs_rowsum": None if draft_probs is None else draft_probs.sum(-1).tolist(),
            "all_greedy": sm.all_greedy, "all_random": sm.all_random,
            "temperature": None if sm.temperature is None else sm.temperature.tolist(),
            "u": seen.get("u"), "recovered": seen.get("rec"), "bonus": bonus.tolist(), "out": out.tolist()})
        return out

    mod.rejection_sample = rs
    mod.sample_recovered_tokens = rec
    mod.generate_uniform_probs = uni


def install_rs(after_import: Any) -> None:
    after_import("vllm.v1.sample.rejection_sampler", patch_rs)


def patch_rs2(mod: Any) -> None:
    import torch
    orig_c = mod.apply_sampling_constraints
    cls = mod.RejectionSampler
    orig_lp = cls.apply_logits_processors

    def c(logits: Any, cu: Any, sm: Any) -> Any:
        fb = torch.isfinite(logits).sum(dim=1).tolist()
        out = orig_c(logits, cu, sm)
        _w({"w": "constraints", "fin_in": fb, "fin_out": torch.isfinite(out).sum(dim=1).tolist(),
            "nan_out": torch.isnan(out).any(dim=1).tolist(),
            "top_k": None if sm.top_k is None else sm.top_k.tolist(),
            "top_p": None if sm.top_p is None else sm.top_p.tolist()})
        return out

    def lp(self: Any, logits: Any, sm: Any, md: Any) -> Any:
        fb = torch.isfinite(logits).sum(dim=1).tolist()
        out = orig_lp(self, logits, sm, md)
        _w({"w": "logitsproc", "fin_in": fb, "fin_out": torch.isfinite(out).sum(dim=1).tolist(),
            "tli": md.target_logits_indices.tolist(), "bli": md.bonus_logits_indices.tolist()})
        return out

    mod.apply_sampling_constraints = c
    cls.apply_logits_processors = lp


def fix_expand(mod: Any) -> None:
    """Scratch counterfactual: copy the C++ kernel's int64 result back into a float output."""
    orig = mod._expand_kernel_impl

    def fixed(output: Any, input_val: Any, cu: Any, replace_from: Any, replace_to: Any, MAX_NUM_TOKENS: Any = None) -> None:
        import torch
        if output.dtype == torch.int64:
            return orig(output, input_val, cu, replace_from, replace_to, MAX_NUM_TOKENS)
        idx = torch.repeat_interleave(torch.arange(cu.shape[0]), torch.diff(cu.long(), prepend=cu.new_zeros(1).long()))
        vals = input_val[idx]
        vals = torch.where(vals == replace_from, torch.full_like(vals, replace_to), vals)
        output[: vals.shape[0]].copy_(vals)
        _w({"w": "expand_fixed", "out": output.tolist()[:8]})

    mod._expand_kernel_impl = fixed
    if hasattr(mod, "expand_kernel") and hasattr(mod.expand_kernel, "func"):
        mod.expand_kernel.func = fixed  # 0.21.0-0.23.0: _FuncWrapper captured the original at import
